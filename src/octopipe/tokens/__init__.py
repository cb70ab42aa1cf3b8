"""Token files: text turned into the flat id files `octopipe run --data` trains on.

- `sources.py`: the input text as a stream of pieces (text files, JSONL records), never whole;
- `tokenizer.py`: a Hugging Face `tokenizers` file or the byte-level tokenizer;
- `train_bpe.py`: a byte-level BPE trained on the input (`--tokenizer train:bpe`);
- `prepare.py`: tokenize, split off the held-out share, write train.bin, val.bin, meta.json;
- `meta.py`: meta.json (`octopipe.tokens/1`), which `run` reads beside a token file.

Only `meta.py` is needed to train; none of this imports torch.
"""
