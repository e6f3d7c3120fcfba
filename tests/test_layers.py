"""The house's layout: imports point down through the layers, never up or round in a circle, and
none hides in a string. model.py stands alone, torch only, importing nothing of the project when it
is imported: the hand-written kernels below it (which import nothing of the project) only inside the
function that needs one, when a setting asks for it (tests/test_standalone.py runs it copied alone).
The basic modules (errors, files, config) import only one another; the guard (nanogpt_perf/guard/),
which only checks, stands on them and the model's shape; the package's core (rules, the runtime and
what measures it, the savers) on the guard; data on the core; training and generation on those; the
performance lab, which times the training step, on top (training imports nothing from it); the
configurator, which reads a script's command line, above the package (which never imports it); the
scripts above it all."""

import ast
from pathlib import Path

from conftest import ROOT

# from the bottom up; a module is in the layer of the longest prefix of its name listed here
LAYERS = {
    "nanogpt_perf.kernels": -1,  # Triton kernels: torch and triton only
    "model": 0,
    # the basic modules: the one error type, files, settings' declarations
    "nanogpt_perf.errors": 0.1,
    "nanogpt_perf.files": 0.2,
    "nanogpt_perf.config": 0.2,
    # the guard: it only checks, on the basic modules (and the model's shape)
    "nanogpt_perf.guard": 0.5,
    # the core: rules, runtime, timing, memory, peak_flops, manifest, the savers, ...
    "nanogpt_perf": 1,
    "nanogpt_perf.data": 2,
    "nanogpt_perf.train": 4,
    "nanogpt_perf.generate": 4,  # generation: the engine, speculative decoding, GGUF out
    "nanogpt_perf.speculative": 4.2,  # on the engine
    "nanogpt_perf.gguf_export": 4,
    # a script's command line, over the core's rules and errors: the package never imports it
    "configurator": 6,
    "lab": 7,  # what measures: bench.py's library and the lab's scripts, over all of the rest
}
LIBRARY = [
    ROOT / "model.py",
    ROOT / "configurator.py",
    *sorted((ROOT / "nanogpt_perf").rglob("*.py")),
]
LIBRARY += sorted((ROOT / "lab").glob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def layer(module: str) -> tuple[str, int]:
    """(the layer's prefix, its height) of a module of the project."""
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return prefix, LAYERS[prefix]


def project_imports(path: Path, in_functions: bool = True) -> set[str]:
    """The modules of the project that a file imports, wherever in the file (function bodies too),
    or with in_functions=False those it imports when it is itself imported (outside every function
    body)."""
    found, nodes = set(), [ast.parse(path.read_text())]
    while nodes:
        node = nodes.pop()
        if not in_functions and isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        ):
            continue
        nodes.extend(ast.iter_child_nodes(node))
        names = (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else []
        )
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {
            n for n in names if n.split(".")[0] in ("model", "configurator", "nanogpt_perf", "lab")
        }
    return found


GRAPH = {module_name(p): project_imports(p) for p in LIBRARY}


def test_imports_point_down_or_stay_in_their_own_layer():
    upward = []
    for module, imports in GRAPH.items():
        own, height = layer(module)
        for imported in imports:
            theirs, their_height = layer(imported)
            if their_height > height or (their_height == height and theirs != own):
                upward.append(f"{module} -> {imported}")
    assert upward == []
    # the whole GPT in one file, importing nothing of the project when imported, and in its
    # functions nothing but the kernels (the losses that never make all the logits), which import
    # nothing of the project but one another
    assert project_imports(ROOT / "model.py", in_functions=False) == set()
    assert GRAPH["model"] and all(layer(m)[0] == "nanogpt_perf.kernels" for m in GRAPH["model"])
    kernels = [m for m in GRAPH if layer(m)[0] == "nanogpt_perf.kernels"]
    assert len(kernels) >= 3 and all(
        layer(i)[0] == "nanogpt_perf.kernels" for m in kernels for i in GRAPH[m]
    )


def test_there_are_no_circular_imports():
    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        for imported in GRAPH.get(module, ()):
            visit(imported, (*path, module))

    for module in GRAPH:
        visit(module, ())


def test_no_import_hides_in_a_string():
    sources = [
        *LIBRARY,
        *ROOT.glob("*.py"),
        *(ROOT / "lab").glob("*.py"),
        *(ROOT / "data").rglob("*.py"),
    ]
    hidden = [
        str(p.relative_to(ROOT))
        for p in sources
        if "import_module(" in p.read_text() or "__import__(" in p.read_text()
    ]
    assert hidden == []


def modules_of_the_house() -> list[str]:
    """Every Python module a reader may open, as a path from the root: the scripts, the package, the
    lab, the scripts/ tools and the datasets' preparers (not the tests, nor the config files)."""
    folders = [
        ROOT.glob("*.py"),
        (ROOT / "nanogpt_perf").rglob("*.py"),
        (ROOT / "lab").glob("*.py"),
    ]
    folders += [(ROOT / "scripts").glob("*.py"), (ROOT / "data").rglob("*.py")]
    paths = [p.relative_to(ROOT).as_posix() for folder in folders for p in folder]
    return sorted(p for p in paths if not p.endswith("__init__.py"))


def test_docs_architecture_names_every_module():
    """A row of its table names the module: its path, or its file's name in a row that names its
    folder (`lab/generate.py`, `loader.py`; `data/*/prepare.py` for every dataset's)."""
    rows = [
        line
        for line in (ROOT / "docs" / "architecture.md").read_text().splitlines()
        if line.startswith("|")
    ]
    cells = [row.split("|")[1] for row in rows if row.count("|") >= 3]

    def named(path: str) -> bool:
        folder, name = path.rpartition("/")[::2]
        folders = {folder + "/", "/".join(folder.split("/")[:-1]) + "/*/"} if folder else {""}
        return any(
            f"`{path}`" in c
            or (f"`{name}`" in c or f"{name}`" in c)
            and any(f"`{f}" in c for f in folders)
            for c in cells
        )

    missing = [p for p in modules_of_the_house() if not named(p)]
    assert missing == [], f"docs/architecture.md has no row for {missing}"
