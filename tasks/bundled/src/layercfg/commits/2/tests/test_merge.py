from layercfg import from_env, resolve


def test_later_layer_wins():
    assert resolve({"debug": False}, {"debug": True}) == {"debug": True}


def test_keys_from_every_layer_are_kept():
    assert resolve({"a": 1}, {"b": 2}, {"c": 3}) == {"a": 1, "b": 2, "c": 3}


def test_layers_are_not_modified():
    base = {"a": 1, "db": {"port": 5432}}
    resolve(base, {"a": 2, "db": {"port": 6543}})
    assert base == {"a": 1, "db": {"port": 5432}}


def test_from_env_nests_on_double_underscore():
    env = {"APP_DB__PORT": "5433", "APP_DEBUG": "1", "HOME": "/root"}
    assert from_env(env) == {"db": {"port": "5433"}, "debug": "1"}


def test_nested_sections_are_merged():
    defaults = {"db": {"host": "localhost", "port": 5432}}
    assert resolve(defaults, {"db": {"user": "app"}}) == {"db": {"host": "localhost", "port": 5432, "user": "app"}}
