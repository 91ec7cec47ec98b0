"""The generated SDK types match the route table and the models (``scripts/gen_clients.py``)."""

from __future__ import annotations

from protocol.methods import METHODS
from runtime.routes import ROUTES, Via
from scripts.gen_clients import PY_PATH, TS_PATH, area_attr, outputs, routed_methods


def test_committed_sdk_types_are_current() -> None:
    for path, text in outputs().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run scripts/gen_clients.py"


def test_every_routed_method_has_a_typed_wrapper_and_a_methods_entry() -> None:
    import pihost_client._generated as gen

    py = PY_PATH.read_text(encoding="utf-8")
    ts = TS_PATH.read_text(encoding="utf-8")
    routed = routed_methods()
    assert set(routed) == {n for n, r in ROUTES.items() if r.via is not Via.CONNECTION}
    api = gen.GeneratedMethods(lambda method, params, mutating, timeout: None)  # type: ignore[arg-type,return-value]
    for method in routed:
        area, verb = method.split(".", 1)
        attr = "".join("_" + c.lower() if c.isupper() else c for c in verb)
        assert callable(getattr(getattr(api, area_attr(area)), attr)), method
        spec = METHODS[method]
        assert f'"{method}": {{ params: {spec.params_model.__name__}; result: {spec.result_model.__name__} }}' in ts
        assert (method in gen.MUTATING) is spec.mutating
    assert "Createdat" not in ts and "Createdat" not in py  # no numbered/derived aliases
    assert "export type KnownBlock = TextBlock | ThinkingBlock | ToolCallBlock" in ts
