import redis


def test_redis_fixture_is_a_real_server(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("smoke:test", "1")
    assert client.get("smoke:test") == b"1"
    assert client.info("server")["redis_version"]
    client.close()
