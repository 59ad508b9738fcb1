"""CUDA-graph capture and replay of the forward pass (whole-model graphs and per-layer graphs)."""
