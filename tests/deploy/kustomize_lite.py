"""A minimal ``kustomize build`` for the offline checks of ``deploy/k8s/``.

kustomize itself installs from neither PyPI nor Debian's archive here, so the tests render the
overlays with this: the subset of kustomize the manifests use, and an error for any other field
(a manifest that starts using one fails the test instead of rendering wrongly). Supported:
``resources`` (files, possibly multi-document, and directories holding a kustomization),
``namespace``, ``labels`` (``includeSelectors: false``: metadata only), ``images``
(``newName``/``newTag``), ``configMapGenerator`` / ``secretGenerator`` (``files``,
``literals``, ``envs``; ``behavior`` create/replace/merge) with ``generatorOptions:
disableNameSuffixHash: true``, and ``patches`` (strategic-merge files; lists of named items
merged by ``name``).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class KustomizeError(ValueError):
    """A kustomization this renderer cannot render, or one kustomize would refuse."""


def build(directory: Path, *, files: dict[Path, Path] | None = None) -> list[Obj]:
    """The objects ``kustomize build directory`` would print.

    ``files`` substitutes generator inputs that are absent from a checkout (e.g. the
    git-ignored ``secrets.env`` by its ``.example``): ``{missing path: path to read}``.
    """
    return _build(directory.resolve(), files or {})


def _build(directory: Path, files: dict[Path, Path]) -> list[Obj]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{path}: fields this renderer does not support: {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects.extend(_build(target, files))
        else:
            objects.extend(_load_documents(target))
    options = spec.get("generatorOptions", {})
    if options and set(options) != {"disableNameSuffixHash"}:
        raise KustomizeError(f"{path}: generatorOptions: only disableNameSuffixHash")
    generators = spec.get("configMapGenerator") or spec.get("secretGenerator")
    if generators and not options.get("disableNameSuffixHash"):
        raise KustomizeError(f"{path}: name suffix hashes are not rendered here")
    for generator in spec.get("configMapGenerator", []):
        _generate(objects, directory, generator, "ConfigMap", files)
    for generator in spec.get("secretGenerator", []):
        _generate(objects, directory, generator, "Secret", files)
    for patch in spec.get("patches", []):
        _patch(objects, directory, patch)
    for image in spec.get("images", []):
        _set_image(objects, image)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = spec["namespace"]
    for label in spec.get("labels", []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise KustomizeError(f"{path}: labels: only metadata labels are rendered here")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    _check_unique(objects)
    return objects


def _load_documents(path: Path) -> list[Obj]:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document:
            raise KustomizeError(f"{path}: not a Kubernetes object: {document!r:.80}")
    return documents


def _generate(
    objects: list[Obj], directory: Path, generator: Obj, kind: str, files: dict[Path, Path]
) -> None:
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, name = entry.rpartition("=")
        source = _input(directory / name, files)
        data[key or Path(name).name] = source.read_text()
    for literal in generator.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"literal {literal!r} is not key=value")
        data[key] = value
    for entry in generator.get("envs", []):
        for line in _input(directory / entry, files).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, sep, value = line.partition("=")
                if not sep:
                    raise KustomizeError(f"{entry}: {line!r} is not KEY=value")
                data[key] = value
    name = generator["name"]
    behavior = generator.get("behavior", "create")
    existing = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if behavior == "create":
        if existing:
            raise KustomizeError(f"{kind} {name} generated twice (use behavior: merge/replace)")
        obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
        if kind == "Secret":
            obj["type"] = "Opaque"
        objects.append(obj)
    elif behavior in ("replace", "merge"):
        if len(existing) != 1:
            raise KustomizeError(f"{behavior}: no {kind} {name} in the resources below")
        obj = existing[0]
        if behavior == "replace":
            obj.pop("data", None)
    else:
        raise KustomizeError(f"{kind} {name}: unknown behavior {behavior!r}")
    if kind == "Secret":
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        obj.setdefault("data", {}).update(encoded)
    else:
        obj.setdefault("data", {}).update(data)


def _input(path: Path, files: dict[Path, Path]) -> Path:
    if path.is_file():
        return path
    for missing, replacement in files.items():
        if missing.resolve() == path.resolve():
            return replacement
    raise KustomizeError(f"{path}: no such file (kustomize build would fail too)")


def _patch(objects: list[Obj], directory: Path, patch: Obj) -> None:
    if set(patch) - {"path", "target"} or "path" not in patch:
        raise KustomizeError(f"patch {patch}: only strategic-merge patches from a path")
    for document in _load_documents(directory / patch["path"]):
        target = patch.get("target") or {
            "kind": document["kind"],
            "name": document["metadata"]["name"],
        }
        matches = [
            o
            for o in objects
            if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]
        ]
        if len(matches) != 1:
            raise KustomizeError(f"patch {patch['path']}: {len(matches)} objects match {target}")
        merged = strategic_merge(matches[0], document)
        matches[0].clear()
        matches[0].update(merged)


def strategic_merge(base: Any, patch: Any) -> Any:
    """Maps merged key by key; lists of maps that all have a ``name`` merged by name; any
    other list, and any scalar, replaced (kustomize's strategic merge for the fields used)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = strategic_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        out_list = copy.deepcopy(base)
        index = {item["name"]: n for n, item in enumerate(out_list)}
        for item in patch:
            if item["name"] in index:
                n = index[item["name"]]
                out_list[n] = strategic_merge(out_list[n], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def pod_spec(obj: Obj) -> Obj | None:
    """The pod spec of a workload object, None for anything else."""
    if obj["kind"] not in POD_TEMPLATE_KINDS:
        return None
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def containers(obj: Obj) -> list[Obj]:
    """Every container of a workload, init containers included."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def split_image(reference: str) -> tuple[str, str | None]:
    """``name[:tag]`` as ``(name, tag)`` (a registry port is not a tag)."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return reference, None
    return name, tag


def _set_image(objects: list[Obj], image: Obj) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise KustomizeError(f"images: {image}: only name, newName, newTag")
    for obj in objects:
        for container in containers(obj):
            name, tag = split_image(container["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            tag = image.get("newTag", tag)
            container["image"] = f"{name}:{tag}" if tag else name


def _check_unique(objects: list[Obj]) -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        if key in seen:
            raise KustomizeError(f"{key} defined twice")
        seen.add(key)
