from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict


class ModelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # What the model's output is compared with: "classification" (targets, cross-entropy,
    # accuracy), "reconstruction" (the input itself, MSE) or "language" (next tokens).
    task: ClassVar[Literal["classification", "reconstruction", "language"]] = "classification"
