"""Tokenize a JSONL corpus with datatrove, for `data.source` to train on in place.

    python scripts/datatrove_tokenize.py CORPUS OUT --tokenizer TOKENIZER [--tasks N] [--megatron]

CORPUS is a .jsonl (.gz) file or a folder of them (the `text` field); TOKENIZER a
tokenizer.json or its folder (the model's). OUT receives datatrove's tokenized files: its own
`.ds` + `.ds.index` (DocumentTokenizer), or Megatron-LM's `.bin` + `.idx` with `--megatron`
(MegatronDocumentTokenizer), one set per task. Then `scaletrain train ... --data.source=OUT`
reads them memory-mapped where they lie (scaletrain.data.direct).

This runs datatrove's local executor (`--tasks` processes on this machine). The same pipeline
runs on a cluster with datatrove's SlurmPipelineExecutor in its place (docs/data.md); nothing
here is scaletrain's own tokenization: the script only wires datatrove's reader and writer.
Documents keep their order (no shuffling), so the ids equal the same corpus ingested by
scaletrain itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", type=Path, help="a .jsonl(.gz) file or a folder of them")
    p.add_argument("out", type=Path, help="where the tokenized files go")
    p.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json or its folder")
    p.add_argument("--tasks", type=int, default=1, help="datatrove tasks (output file sets)")
    p.add_argument("--megatron", action="store_true", help="write Megatron's .bin/.idx")
    args = p.parse_args(argv)
    try:
        from datatrove.executor import LocalPipelineExecutor
        from datatrove.pipeline.readers import JsonlReader
        from datatrove.pipeline.tokens import DocumentTokenizer, MegatronDocumentTokenizer
    except ImportError:
        p.error("datatrove is not installed: pip install datatrove")
    tok = args.tokenizer / "tokenizer.json" if args.tokenizer.is_dir() else args.tokenizer
    if not tok.is_file():
        p.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there")
    if not args.corpus.exists():
        p.error(f"{args.corpus}: no such file or folder")
    folder, pattern = (
        (args.corpus, None) if args.corpus.is_dir() else (args.corpus.parent, args.corpus.name)
    )
    reader = JsonlReader(str(folder), glob_pattern=pattern)
    writer = (
        MegatronDocumentTokenizer(str(args.out), tokenizer_name_or_path=str(tok))
        if args.megatron
        else DocumentTokenizer(
            str(args.out), tokenizer_name_or_path=str(tok), shuffle_documents=False
        )
    )
    LocalPipelineExecutor(
        [reader, writer], tasks=args.tasks, logging_dir=str(args.out / "logs")
    ).run()
    print(f"tokenized {args.corpus} into {args.out}: train with --data.source={args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
