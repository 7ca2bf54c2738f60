"""Transports: the embedded in-process runner and the Kafka app. No memory logic here."""
