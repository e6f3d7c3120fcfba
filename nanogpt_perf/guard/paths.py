"""The checks of settings that name files and folders, or lists of names (a setting's check= in its
declaration: nanogpt_perf/config.py): each raises ValueError saying what would be valid ('a path
without a NUL character'), which configure turns into the line "out_dir must be a path without ...,
not ...". A setting whose check is a path's has a leading ~ expanded (path_rule). This module
imports no torch: the data preparers' worker processes import it."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanogpt_perf.files import file_kind

Check = Callable[[Any], None]
# bytes: a name in a path, a whole path (Linux's and most file systems' limits)
NAME_MAX, PATH_MAX = 255, 4096


def path_rule(check: Check) -> Check:
    """Mark check as one of a setting that names a file or folder: configure expands a leading ~ in
    its value (the shell expands ~ only at the start of a word, so --out_dir=~/x reaches a script as
    the text '~/x')."""
    check.is_path = True  # type: ignore[attr-defined]
    return check


def check_path(value: str) -> None:
    """A ValueError saying what would be valid unless the OS can take value as a path: empty, a NUL
    character, a ~ that no shell expanded, a name or the whole path too long, a part of its folders
    a file."""
    check_name(value)
    parent = next((p for p in Path(os.path.abspath(value)).parents if os.path.lexists(p)), None)
    if parent is not None and not os.path.isdir(parent):
        raise ValueError(f"a path in folders ({parent} is {file_kind(parent)})")


def check_name(value: str) -> None:
    """check_path's checks of the text alone."""
    if not value:
        raise ValueError("a path")
    if "\0" in value:
        raise ValueError("a path without a NUL character")
    if value.startswith("~"):
        home = os.path.expanduser(value)
        instead = f": {home}" if home != value else ""
        raise ValueError(
            f"a path without a leading ~ (no shell expands it inside a flag; write it out{instead})"
        )
    encoded = os.fsencode(value)
    if len(encoded) >= PATH_MAX:
        raise ValueError(f"a path of less than {PATH_MAX:,} bytes (this one has {len(encoded):,})")
    if long := next((name for name in encoded.split(b"/") if len(name) > NAME_MAX), None):
        raise ValueError(
            f"a path whose every name has at most {NAME_MAX} bytes (one has {len(long):,})"
        )


a_path = path_rule(check_path)


@path_rule
def optional_path(value: str) -> None:
    try:
        check_path(value) if value != "" else None
    except ValueError as e:
        raise ValueError(f"'' or {e}") from None


def writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


@path_rule
def output_folder(value: str) -> None:
    """A folder to write into: a path that is no file, whose nearest existing folder this user may
    write."""
    check_path(value)
    if os.path.lexists(value) and not os.path.isdir(value):
        raise ValueError(f"a folder (this is {file_kind(value)})")
    nearest = next(
        p for p in (value, *map(str, Path(os.path.abspath(value)).parents)) if os.path.exists(p)
    )
    if not writable(nearest):
        raise ValueError(f"a folder that you may write ({nearest} is not writable)")


def output_file(suffix: str, optional: bool = True) -> Check:
    """For a setting that names a file to write: '' where optional (none), or a path ending in
    suffix that is no folder, in a folder that exists or can be made, and that this user may
    write."""
    what = ("'' or " if optional else "") + f"a {suffix} file"

    def check(value: str) -> None:
        path = Path(value)
        if optional and value == "":
            return
        if path.suffix.lower() != suffix:
            raise ValueError(what)
        if os.path.isdir(value) or value.endswith(("/", os.sep)):
            raise ValueError(f"{what} (a file, not a folder)")
        try:
            check_name(value)
        except ValueError as e:
            raise ValueError(f"{what}, {e}") from None
        folder = next(p for p in path.absolute().parents if os.path.exists(p))  # "/" at least
        if not os.path.isdir(folder):
            raise ValueError(f"{what} in a folder ({folder} is {file_kind(folder)})")
        if not writable(str(folder)) or (os.path.exists(value) and not os.access(value, os.W_OK)):
            raise ValueError(
                f"{what} that you may write ({path if os.path.exists(value) else folder} is not "
                "writable)"
            )

    return path_rule(check)


def init_from_one_of(*choices: str) -> Check:
    """choices (e.g. 'scratch', 'resume' and GPT-2's hub names) or an existing folder in
    transformers' format."""

    def choice_or_folder(value: str) -> None:
        if value in choices:
            return
        try:
            # first: a ~ no shell expanded, a name too long, '' (which Path takes as '.')
            check_path(value)
            folder = os.path.isdir(value)
        except ValueError:
            folder = False
        if not folder:
            raise ValueError(f"{', '.join(choices)} or a transformers folder")

    # for --help
    choice_or_folder.choices = (*choices, "a transformers folder")  # type: ignore[attr-defined]
    return path_rule(choice_or_folder)


def comma_separated(*choices: str) -> Check:
    """For a setting that names some of choices, comma-separated ('random,epochs')."""

    def names(value: str) -> None:
        if not all(name.strip() in choices for name in value.split(",")):
            raise ValueError(f"a comma-separated list of {', '.join(choices)}")

    return names
