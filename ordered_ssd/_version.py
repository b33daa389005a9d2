"""The version of ordered-ssd (a leaf module: the fingerprint reads it without importing the package)."""
__version__ = "0.1.0.dev0"
