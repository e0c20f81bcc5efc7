"""A fake state-spaces/mamba for the CPU tests: the module paths and signatures of mamba_ssm 2.3.2's
Triton ops (`ops.triton.ssd_combined`, `ops.triton.selective_state_update`), computed with
ssmcheck's torch baseline so they are correct. Put tests/fake_peers on sys.path to import it."""
