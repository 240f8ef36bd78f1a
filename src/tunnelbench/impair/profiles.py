"""The impairment profile library. `baseline` applies nothing."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""

    @property
    def is_baseline(self) -> bool:
        return True


PROFILES: dict[str, Profile] = {
    "baseline": Profile(name="baseline", description="no impairment: the raw namespace path"),
}
