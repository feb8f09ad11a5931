"""Two SQuAD files from one, split by article: where only the dev files are at hand (offline
here), train on the first half of the dev articles and evaluate on the second. Splitting by
article, not by question, keeps every passage and its title on one side, so no evaluation
passage is seen in training.

    python -m bertkit.tasks.squad.dev_halves dev-v1.1.json OUT_DIR
    bertkit recipe=squad task.train_file=OUT_DIR/dev-v1.1.first-half.json \
        task.validation_file=OUT_DIR/dev-v1.1.second-half.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertkit.data.atomic_files import write_json_atomic
from bertkit.errors import BertkitError


def split_by_articles(path: Path, out_dir: Path) -> tuple[Path, Path]:
    """(first half, second half): the first ceil(n/2) articles, then the rest, each file in the
    official layout with the source's version."""
    path, out_dir = Path(path), Path(out_dir)
    try:
        dataset = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BertkitError(f"{path}: cannot read a SQuAD JSON file ({err})") from None
    articles = dataset.get("data") if isinstance(dataset, dict) else None
    if not isinstance(articles, list) or len(articles) < 2:
        raise BertkitError(f"{path}: expected the official layout with at least 2 articles "
                           f"under 'data'")
    half = (len(articles) + 1) // 2
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, part in (("first-half", articles[:half]), ("second-half", articles[half:])):
        target = out_dir / f"{path.stem}.{name}.json"
        write_json_atomic(target, {"version": dataset.get("version"), "data": part})
        written.append(target)
    return written[0], written[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="a SQuAD file in the official layout")
    parser.add_argument("out_dir", type=Path, help="where the two halves are written")
    args = parser.parse_args(argv)
    for target in split_by_articles(args.file, args.out_dir):
        print(target)


if __name__ == "__main__":
    main()
