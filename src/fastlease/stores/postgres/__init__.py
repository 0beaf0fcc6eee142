"""The PostgreSQL wing: the tables and statements (``sql``), the store's own connections
(``session``), the store (``store``) and its release wake-up over LISTEN/NOTIFY (``feed``)."""
