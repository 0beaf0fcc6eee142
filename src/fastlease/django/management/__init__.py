"""The management commands of ``fastlease.django``."""
