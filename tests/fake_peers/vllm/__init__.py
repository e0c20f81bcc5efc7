"""A fake vLLM for the CPU tests: the module paths and signatures of vLLM 0.33's Mamba2 ops
(`model_executor.layers.mamba.ops.ssd_combined`, `...ops.mamba_ssm`), computed with ssmcheck's
torch baseline so they are correct. Put tests/fake_peers on sys.path to import it."""
