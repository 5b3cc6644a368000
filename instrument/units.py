"""Which modules of a model are timed: its blocks (the modules the forward actually calls) or its layers."""

from __future__ import annotations

from torch import nn

DOMINANT_SHARE = 0.8
"""A child holding this share of its parent's parameters is the model (HF's ``*ForCausalLM`` around its
transformer): its children are the blocks, beside the parent's other children (the head)."""


def compiled(module: nn.Module) -> bool:
    """True for a module whose call Dynamo traces: ``torch.compile(m)`` or ``m.compile()``.

    A hook inside a compiled region splits the graph (Dynamo cannot trace a timestamp), so units stop at
    a compiled module, timed from outside: hooks on the eager wrapper of ``torch.compile(m)``, a wrapper
    around the compiled call of ``m.compile()`` (instrument/compiled.py), never inside.
    """
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


def model_name(module: nn.Module) -> str:
    """The class name of a model: a compiled, DDP-wrapped or fully_shard'ed one is named after the model inside."""
    inner = getattr(module, "_orig_mod", module)
    if type(inner).__name__ == "DistributedDataParallel":
        inner = inner.module
    # fully_shard (FSDP2) swaps the class for a generated FSDP<Class>(FSDPModule, Class): name the user's class.
    cls = type(inner)
    user = next((b for b in cls.__bases__ if cls.__name__ == f"FSDP{b.__name__}"), cls)
    return user.__name__


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _called_children(node: nn.Module) -> list[nn.Module]:
    """The children of ``node``, a ModuleList/ModuleDict replaced by its items: containers are never called."""
    out: list[nn.Module] = []
    for child in node.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out.extend(_called_children(child))
        else:
            out.append(child)
    return out


def block_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks of a model: its top-level children, seen through thin wrappers and containers.

    Descends while there is exactly one child, and into a child that holds most of the parameters
    (``DOMINANT_SHARE``), keeping that child's siblings as blocks. Never descends into a compiled module.
    A leaf without parameters (an activation, dropout, pooling between the layers of an ``nn.Sequential``) is
    no block: its work falls between the blocks, into the model's own time (instrument/spans.py), and its hooks
    cost without telling anything the layers beside it do not (41 ReLUs: 15 % of dagtop's cost on a 41-layer MLP).
    """
    names = {id(m): n for n, m in root.named_modules()}
    node = root
    while not compiled(node):
        children = _called_children(node)
        if len(children) != 1:
            break
        node = children[0]
    if compiled(node) or not (children := _called_children(node)):
        return [(names[id(node)] or model_name(node), node)]
    while True:
        total = _param_count(node)
        dominant = next((c for c in children if not compiled(c) and _called_children(c) and total
                         and _param_count(c) >= DOMINANT_SHARE * total), None)
        if dominant is None:
            break
        at = children.index(dominant)
        node, children = dominant, children[:at] + _called_children(dominant) + children[at + 1:]
    timed = [c for c in children if _param_count(c) or _called_children(c)]
    return [(names[id(c)], c) for c in timed or children]


def layer_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers of a model: the leaf modules that own trainable parameters; a compiled module is a leaf."""
    units: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()

    def visit(name: str, module: nn.Module) -> None:
        if id(module) in seen:  # a module used twice is hooked once, as named_modules() lists it once
            return
        seen.add(id(module))
        if compiled(module):
            units.append((name or model_name(module), module))
            return
        children = list(module.named_children())
        if not children and any(p.requires_grad for p in module.parameters(recurse=False)):
            units.append((name or type(module).__name__, module))
        for child_name, child in children:
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", root)
    return units or block_units(root)


def span_levels(root: nn.Module, units: list[tuple[str, nn.Module]],
                root_name: str = "") -> list[list[tuple[str, nn.Module]]]:
    """The modules around ``units`` that run code of their own (instrument/spans.py), by depth.

    Every module that holds a unit, up to ``root``, except containers (a ModuleList is never called) and
    units themselves. Level 0 is the outermost; modules of one level never hold each other, so each level
    can be timed as units are (a UnitTimer assumes its units do not nest). Named as the units are: by path,
    after ``root_name`` and a dot if given; the root itself ``root_name``, else its class name.
    """
    unit_ids = {id(m) for _, m in units}
    if id(root) in unit_ids or compiled(root):
        return []
    paths = {id(m): n for n, m in root.named_modules()}
    named = dict(root.named_modules())
    spans: dict[str, nn.Module] = {}
    for _, unit in units:
        path = paths.get(id(unit))
        if not path:
            continue
        parts = path.split(".")
        for depth in range(len(parts)):
            prefix = ".".join(parts[:depth])
            module = named[prefix]
            if id(module) not in unit_ids and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                spans[prefix] = module
    levels: dict[int, list[tuple[str, nn.Module]]] = {}
    for path, module in sorted(spans.items()):
        depth = sum(1 for other in spans if other != path and (other == "" or path.startswith(other + ".")))
        name = f"{root_name}.{path}" if root_name and path else path or root_name or model_name(root)
        levels.setdefault(depth, []).append((name, module))
    return [levels[d] for d in sorted(levels)]
