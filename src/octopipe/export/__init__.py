"""A trained checkpoint as a Hugging Face model folder (`octopipe export-hf`): `hf.py` writes the
weights into the model's `transformers` config, `hf_tokenizer.py` finds and saves its
tokenizer. A checkpoint as a model is no engine: the engines a plan runs on, and what each
writes, are `octopipe.engines`. These modules import torch (and transformers) when called.
"""
