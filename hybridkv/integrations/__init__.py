"""Integrations of the verified CacheManager into other engines (each imports its engine lazily:
``import hybridkv`` never imports one)."""
