"""Rewrite README.md's generated compatibility tables (between <!-- matrix:begin --> and <!-- matrix:end -->)
from the matrix: `python scripts/update_readme_table.py` after any matrix change (tests/test_cli.py checks it)."""

from __future__ import annotations

import sys
from pathlib import Path

from nvfp4compat.loader import load_matrix
from nvfp4compat.table import matrix_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> int:
    text = README.read_text(encoding="utf-8")
    head, rest = text.split("<!-- matrix:begin -->", 1)
    _, tail = rest.split("<!-- matrix:end -->", 1)
    README.write_text(f"{head}<!-- matrix:begin -->\n{matrix_markdown(load_matrix()).strip()}\n<!-- matrix:end -->{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
