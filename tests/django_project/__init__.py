"""A minimal Django project for the tests of ``fastlease.django``: settings from environment variables
(so that a gunicorn started by a test reads the same databases), a model that counts executions, and
views of each kind the integration supports."""
