"""Prints the flag reference table of docs/flags.md from resnet_tpu/flags.py.

  python -m tests.flag_reference

tests/test_readme.py checks that docs/flags.md contains exactly this table,
so the reference cannot drift from the code.
"""
from resnet_tpu.config import FLAG_FIELDS
from resnet_tpu.flags import HELP


def flag_table() -> str:
  lines = ["| flag | part | default | meaning |", "|---|---|---|---|",
           f"| `--model_dir` | | (required) | {HELP['model_dir']} |"]
  for name, (part, field) in FLAG_FIELDS.items():
    default = f"`{field.default!r}`" if field.default != "" else "`''`"
    lines.append(f"| `--{name}` | {part} | {default} | {HELP[name]} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(flag_table(), end="")
