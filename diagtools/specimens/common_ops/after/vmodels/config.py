"""Model configuration; reads the platform to fill in device defaults."""

from dataclasses import dataclass

from vmodels.platforms import current_platform


@dataclass
class ModelConfig:
    device_count: int = current_platform.device_count
