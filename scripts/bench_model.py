"""What scripts/make-dense-bench-model.py and make-moe-bench-model.py share: seeded random weights in
GGUF's axis order and writing the finished file."""
import numpy as np
import gguf


class RandomWeights:
    """Normal weights with std 0.02 (norms are 1) from a fixed seed, so every run writes the same file."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, *shape, dtype=np.float16):
        # numpy order: the reverse of GGUF's ne (ne0 is the last axis)
        return (self.rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)

    @staticmethod
    def ones(n):
        return np.ones(n, dtype=np.float32)


def write(w: gguf.GGUFWriter, out: str) -> None:
    """Writes the header, metadata and tensors added to w, and closes the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}")
