"""The Django app ``fastlease.django`` (label ``fastlease``): it has no models; installing it adds the
``fastlease`` management command and closes the settings' client when a test changes its settings."""

from __future__ import annotations

from django.apps import AppConfig
from django.core.signals import setting_changed

from . import _setting_changed

__all__ = ["FastleaseConfig"]


class FastleaseConfig(AppConfig):  # type: ignore[misc]  # (Django ships no type information)
    """``INSTALLED_APPS = [..., "fastlease.django"]``."""

    name = "fastlease.django"
    label = "fastlease"
    verbose_name = "fastlease"

    def ready(self) -> None:
        """Follow ``override_settings`` of ``FASTLEASE`` and ``DATABASES``: the next client uses the new ones."""
        setting_changed.connect(_setting_changed, dispatch_uid="fastlease.django.setting_changed")
