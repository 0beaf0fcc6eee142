"""What the views did: one row per execution of a view's body (never per request)."""

from __future__ import annotations

from django.db import models


class Execution(models.Model):
    """One run of a view's body: which view, the request's Idempotency-Key, and the worker's PID."""

    view = models.CharField(max_length=100)
    key = models.CharField(max_length=300)
    pid = models.IntegerField()

    class Meta:
        app_label = "django_project"
