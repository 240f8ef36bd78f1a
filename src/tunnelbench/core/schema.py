"""The base of every file schema (scenario, suite, lab spec): unknown fields are refused, never ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
