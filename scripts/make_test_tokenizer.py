#!/usr/bin/env python3
"""Train the small byte-level BPE tokenizer committed for tests and benches.

Usage: python3 -m venv .venv && .venv/bin/pip install tokenizers
       .venv/bin/python scripts/make_test_tokenizer.py
Writes tests/fixtures/tokenizers/tiny-bpe.json, trained on the repository's own Markdown
(deterministic for a given checkout), so no network or model download is needed.
"""
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizers" / "tiny-bpe.json"

files = sorted(str(p) for p in ROOT.glob("**/*.md") if ".venv" not in p.parts and "target" not in p.parts)
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=2000,
    min_frequency=2,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train(files, trainer)
OUT.parent.mkdir(parents=True, exist_ok=True)
tok.save(str(OUT))
print(f"{OUT.relative_to(ROOT)}: vocab {tok.get_vocab_size()} from {len(files)} files")
