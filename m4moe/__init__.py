"""m4moe: GShard-style Mixture-of-Experts Transformers for massively
multilingual machine translation in TensorFlow 2."""

__version__ = "0.1.0"
