"""Test blobs for the disk tier: a key per integer and a seeded payload tensor."""
import torch


def k(i):
    """Disk key number i (32 hex digits, as the tier's keys are)."""
    return f"{i:032x}"


def x(i, n=1024):
    """n seeded fp32 values: the payload number i."""
    return torch.randn(n, generator=torch.Generator().manual_seed(i))
