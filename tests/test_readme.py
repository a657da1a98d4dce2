"""The README's Python example runs as written."""

import pathlib
import re


def test_readme_example_runs():
  text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert blocks, "README has no python example"
  for code in blocks:
    exec(compile(code, "README.md", "exec"), {})
