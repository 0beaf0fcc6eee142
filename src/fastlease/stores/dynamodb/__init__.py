"""The DynamoDB wing: the store (``store``), its requests through boto3 (``transport``) or through
its own HTTP client (``fastpath``, signed by ``sigv4``)."""
