"""``python manage.py fastlease``: see ``fastlease.py`` here."""
