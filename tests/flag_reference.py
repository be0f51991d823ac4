"""Prints the README's flag reference table from resnet_tpu/flags.py.

  python -m tests.flag_reference

tests/test_readme.py checks that README.md contains exactly this table, so
the reference cannot drift from the code.
"""
import dataclasses

from resnet_tpu.config import TrainConfig
from resnet_tpu.flags import HELP


def flag_table() -> str:
  lines = ["| flag | default | meaning |", "|---|---|---|"]
  for field in dataclasses.fields(TrainConfig):
    default = "(required)" if field.default is dataclasses.MISSING else (
        f"`{field.default!r}`" if field.default != "" else "`''`")
    lines.append(f"| `--{field.name}` | {default} | {HELP[field.name]} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(flag_table(), end="")
