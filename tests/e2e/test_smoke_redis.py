import redis


def test_redis_fixture_is_a_real_server(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("specroute:test", "1")
    assert client.get("specroute:test") == b"1"
    assert client.info("server")["redis_version"]
    client.close()
