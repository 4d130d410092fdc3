"""elastream: an elastic stream-processing operator (Stela planning, CCR migration through Redis)."""

__version__ = "0.1.0"
