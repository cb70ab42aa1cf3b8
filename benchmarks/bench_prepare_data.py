"""`octopipe prepare-data` streamed beside tokenizing the whole text at once: wall seconds and
peak memory (the process's max RSS) of each, side by side, on one generated file.

    .venv/bin/python benchmarks/bench_prepare_data.py              # 100 MB, one line
    .venv/bin/python benchmarks/bench_prepare_data.py --mb 50 --lines

The text is words of a small vocabulary (one line, or 80-character lines with --lines). Two
tokenizers: the byte tokenizer, and a byte-level BPE of 4,096 ids trained here with
`tokenizers` on the first megabyte. "Whole" reads the file into memory, encodes it in one
call (`Tokenizer.encode`, or the bytes), and writes the ids: what a hand-written script does.
Each runs in a fresh process; RSS is that process's peak, as GNU time (`/usr/bin/time`) reports.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WHOLE = """
import sys, numpy as np
text = open(sys.argv[1], encoding="utf-8").read()
if sys.argv[2] == "byte":
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.uint16)
else:
    from tokenizers import Tokenizer
    ids = np.asarray(Tokenizer.from_file(sys.argv[2]).encode(text).ids, dtype=np.uint16)
ids.tofile(sys.argv[3])
print(len(ids))
"""


def write_text(path: Path, mb: int, lines: bool) -> None:
    rng = random.Random(0)
    words = "pipeline stage device bubble model layer forward backward weight the of and".split()
    with path.open("w", encoding="utf-8") as f:
        written = 0
        while written < mb * 1_000_000:
            chunk = " ".join(rng.choices(words, k=20000)) + " "
            if lines:
                chunk = "\n".join(chunk[i : i + 80] for i in range(0, len(chunk), 80)) + "\n"
            f.write(chunk)
            written += len(chunk)


def bpe(path: Path, sample: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([sample.read_text(encoding="utf-8")[:1_000_000]], trainer)
    tok.save(str(path))
    return path


def timed(argv: list[str]) -> tuple[float, float, str]:
    """Seconds, peak RSS in MiB, and stdout of a fresh process. GNU time measures the RSS: a
    child forked from this process would count this process's pages in its own peak."""
    start = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True, check=True
    )
    rss_kib = int(done.stderr.strip().splitlines()[-1])
    return time.perf_counter() - start, rss_kib / 1024, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--lines", action="store_true", help="80-character lines, not one line")
    args = ap.parse_args()
    octopipe = str(Path(sys.executable).parent / "octopipe")
    print("| tokenizer | input | tokens | streamed s | streamed MiB | whole s | whole MiB | "
          "memory whole / streamed |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = root / "corpus.txt"
        write_text(text, args.mb, args.lines)
        shape = "80-char lines" if args.lines else "one line"
        for name, tokenizer in (("byte", "byte"), ("BPE 4,096", str(bpe(root / "t.json", text)))):
            streamed = timed(
                [octopipe, "prepare-data", "--tokenizer", tokenizer, "--input", str(text)]
                + ["--val-fraction", "0", "-o", str(root / "out")]
            )
            whole = timed([sys.executable, "-c", WHOLE, str(text), tokenizer, str(root / "w.bin")])
            tokens = int(whole[2].strip())
            assert (root / "out" / "train.bin").stat().st_size == 2 * tokens  # the same ids
            print(
                f"| {name} | {args.mb} MB, {shape} | {tokens:,} | {streamed[0]:.1f} | "
                f"{streamed[1]:.0f} | {whole[0]:.1f} | {whole[1]:.0f} | "
                f"{whole[1] / streamed[1]:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
