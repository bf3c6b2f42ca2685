"""optbench inside other people's training loops: `OptbenchCallback` for a Hugging Face `Trainer`."""

from optbench.integrations.callback import OptbenchCallback

__all__ = ["OptbenchCallback"]
