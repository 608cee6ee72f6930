"""Validate OCSF events against the OCSF schema: ocsf-json-schema (a maintained PyPI package
that builds JSON Schema from the OCSF schema exports it ships, here OCSF 1.5.0) and jsonschema.
The class and profiles are the ones proxy.core.ocsf says it writes."""

from __future__ import annotations

from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

from proxy.core import ocsf


@cache
def validator() -> Draft202012Validator:
    schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version=ocsf.VERSION))
    name = schema.lookup_class_name_from_uid(class_uid=ocsf.CLASS_UID)
    assert name == "http_activity"
    js = schema.get_class_schema(class_name=name, profiles=ocsf.PROFILES)
    Draft202012Validator.check_schema(js)
    return Draft202012Validator(js)


def ocsf_errors(event: dict[str, Any]) -> list[str]:
    """Every schema error of ``event``, as "path: message" ([] when valid)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(event)]
