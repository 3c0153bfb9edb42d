"""CUDA-side tools: batch-latency profiling of a Llama/Qwen-style decoder (needs torch)."""
