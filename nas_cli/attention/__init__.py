"""Attention cores. One file per scheme family; ``conf/attention/*.yaml`` is the registry."""
from nas_cli.attention.base import AttentionCore, AttentionOutput, SchemeError

__all__ = ["AttentionCore", "AttentionOutput", "SchemeError"]
