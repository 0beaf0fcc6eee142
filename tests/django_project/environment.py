"""The environment variables that configure the test project (read by ``settings.py``, set by
``fixtures.py``)."""

#: The SQLite file of the ``default`` database (required).
SQLITE_VARIABLE = "FASTLEASE_DJANGO_SQLITE"
#: A PostgreSQL DSN, which becomes the ``postgres`` database.
POSTGRES_VARIABLE = "FASTLEASE_DJANGO_POSTGRES_DSN"
#: The alias that the leases and the views' writes use (default ``default``).
DATABASE_VARIABLE = "FASTLEASE_DJANGO_DATABASE"
