"""nebula.torch.DiLoCo on CUDA parameters (label gpu): the two-cluster cases of
test_python_torch.py with the model and its data on the GPU, so that every parameter is staged
through a pinned host buffer each round (device to host, the round, host to device): fp32
blocking, bf16 overlapped with early landing, fp32 from the optimizer's step hook. Checked as
there: bit-identical models and one global hash on both clusters, the loss down, and every
parameter still on the GPU at the end.

Exits 77 (CTest: skipped) without torch, numpy or cffi, or without a CUDA device."""

import sys
import unittest

try:
    import numpy  # noqa: F401
    import cffi  # noqa: F401
    import torch
except ImportError as e:
    print(f"skipped: {e.name} is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

if not torch.cuda.is_available():
    print("skipped: no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

import test_python_torch as cases  # noqa: E402  (beside this file)


class CudaParams(unittest.TestCase):
    def test_fp32_blocking(self):
        cases.DiLoCoTwoClusters.check(self, torch.float32, False, device="cuda")

    def test_bf16_overlap_land_early(self):
        cases.DiLoCoTwoClusters.check(self, torch.bfloat16, False, overlap=3, early=True,
                                      device="cuda")

    def test_fp32_optimizer_hook(self):
        cases.DiLoCoTwoClusters.check(self, torch.float32, True, device="cuda")


if __name__ == "__main__":
    unittest.main()
