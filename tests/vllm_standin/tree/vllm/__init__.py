"""Stand-in of the ``vllm`` package for the tests (no vLLM code): the modules the vLLM plugins and
vLLM 0.33's Triton attention files touch, as small modules of our own (see ``tests/vllm_standin``)."""
