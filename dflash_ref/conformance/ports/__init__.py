"""The ports' wing of the conformance kit: everything that runs an implementation on a golden bundle and reads
its tensors, each a `Port` (port.py), beside the judge that never imports them.

    registry.py            the shipped ports by name (`verify --impl NAME`) and `module:factory` for your own
    reference.py           this package as a port (its hook points and StepRecords)
    torch_taps.py          the taps layer, PyTorch: scoped hooks and patches (`Taps`), to_numpy, the attention
                           weights a kernel computed, and teacher-forced steps for a port without a loop
    mlx_taps.py            the taps layer, MLX: stand-ins (`Tap`, `Taps`), as_numpy, the attention weights
    mlx_states.py          an mlx-lm hybrid target's Gated DeltaNet states in the kit's layout
    official.py            the official PyTorch code (`zlab`)          official_mlx.py   its MLX backend (`mlx`)
    transformers_port.py   transformers' own DFlash (`transformers`)
    pypi/                  the PyPI ports: dflash-mlx, mlx-dspark, speculators
    engines/               the serving engines: vLLM (one sequence, a batch, its server) and llama.cpp

Nothing is imported here: `registry` imports every port (and torch), and an engine's runner (engines/vllm_run.py)
runs in the engine's own Python, which must reach its module without the others.
"""
