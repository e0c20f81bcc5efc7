from ssmcheck.console import main

main()
