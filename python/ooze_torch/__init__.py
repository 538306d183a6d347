"""ooze's PyTorch trainer worker: the native trainer worker's protocol (native/worker/protocol.ts) served
by a transformers causal LM, on CPU or CUDA, on one process or an FSDP2 group. Run as
`python -m ooze_torch [--device auto|cpu|cuda] [--dtype fp32|bf16] [--gpus N]`."""
