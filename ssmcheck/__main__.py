from ssmcheck.cli import main

main()
