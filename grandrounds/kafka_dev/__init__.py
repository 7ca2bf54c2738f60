"""A local Apache Kafka broker without Docker or Maven (`grandrounds kafka dev`): jars from Maven Central, checked, cached."""
