"""agent/config.py: flags over environment variables over the config file."""

from __future__ import annotations

import os

import pytest

from agent.config import OPTIONS, ConfigError, host_name, load, parse_labels


@pytest.fixture
def config_file(tmp_path):
    def write(body: str) -> str:
        path = tmp_path / "agent.ini"
        path.write_text(body)
        return str(path)

    return write


REQUIRED = ["--server", "https://bw.example", "--target-dir", "/srv/conf"]


def test_flags_win_over_variables_which_win_over_the_file(config_file):
    path = config_file("[agent]\nserver = https://file.example\ntarget_dir = /srv/file\n"
                       "reload_command = file-reload\nvalidate_command = file-validate\n"
                       "start_command = file-start\n")
    environ = {"BELLWETHER_SERVER": "https://env.example", "BELLWETHER_RELOAD_COMMAND": "env",
               "BELLWETHER_VALIDATE_COMMAND": "env-validate"}

    config = load(["--config", path, "--server", "https://flag.example",
                   "--validate-command", "flag-validate"], environ)

    assert config.server == "https://flag.example"  # flag over variable over file
    assert config.validate_command == "flag-validate"  # flag over variable over file
    assert config.reload_command == "env"  # variable over file
    assert config.start_command == "file-start"  # file only
    assert config.target_dir == "/srv/file"


def test_every_option_can_come_from_its_environment_variable():
    environ = {f"BELLWETHER_{name.upper()}": "7" for name, _ in OPTIONS if name != "log_level"}
    environ["BELLWETHER_LOG_LEVEL"] = "debug"
    environ.update(BELLWETHER_SERVER="https://env.example", BELLWETHER_TARGET_DIR="/srv/x",
                   BELLWETHER_STATE_DIR="/var/lib/bw", BELLWETHER_LABELS="a=b",
                   BELLWETHER_HEALTH_URL="http://127.0.0.1:7/")

    config = load([], environ)

    assert (config.server, config.target_dir, config.state_dir) == (
        "https://env.example", "/srv/x", "/var/lib/bw")
    assert (config.token, config.enrollment_token, config.name) == ("7", "7", "7")
    assert (config.command_timeout, config.poll_interval) == (7.0, 7.0)
    assert (config.health_command, config.health_url) == ("7", "http://127.0.0.1:7/")
    assert (config.health_timeout, config.health_retries, config.health_interval) == (
        7.0, 7, 7.0)
    assert config.labels == {"a": "b"}


def test_the_config_file_can_be_named_by_a_variable(config_file):
    path = config_file("[agent]\nserver = https://file.example\ntarget_dir = /srv/file\n")

    config = load([], {"BELLWETHER_CONFIG": path})

    assert (config.server, config.target_dir) == ("https://file.example", "/srv/file")


def test_the_config_flag_wins_over_the_config_variable(config_file, tmp_path):
    path = config_file("[agent]\nserver = https://flag-file.example\ntarget_dir = /srv/f\n")

    config = load(["--config", path], {"BELLWETHER_CONFIG": str(tmp_path / "absent.ini")})

    assert config.server == "https://flag-file.example"


def test_an_unreadable_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(["--config", str(tmp_path / "absent.ini"), *REQUIRED], {})


def test_an_unknown_key_in_the_file_is_a_config_error_naming_it(config_file):
    path = config_file("[agent]\nserver = https://x\ntarget_dir = /srv\nreload_comand = typo\n")

    with pytest.raises(ConfigError, match="reload_comand"):
        load(["--config", path], {})


@pytest.mark.parametrize("argv, missing", [
    (["--target-dir", "/srv/conf"], "--server is required"),
    (["--server", "https://bw.example"], "--target-dir is required"),
    (["--server", "", "--target-dir", "/srv/conf"], "--server is required"),
])
def test_server_and_target_dir_are_required(argv, missing):
    with pytest.raises(ConfigError, match=missing):
        load(argv, {})


def test_state_dir_defaults_to_var_lib_bellwether_and_the_agent_name():
    assert load(REQUIRED, {}).state_dir == f"/var/lib/bellwether/{host_name()}"
    assert load([*REQUIRED, "--name", "web-1"], {}).state_dir == "/var/lib/bellwether/web-1"


def test_an_older_agents_default_state_dir_is_kept_while_it_holds_a_state(tmp_path):
    (tmp_path / ".bellwether-state").mkdir()
    (tmp_path / ".bellwether-state" / "state.json").write_text("{}")
    target = str(tmp_path / "conf")

    config = load(["--server", "https://x", "--target-dir", target, "--name", "zz-none"], {})

    assert config.state_dir == str(tmp_path / ".bellwether-state")
    assert config.legacy_state_dir is True


def test_relative_directories_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    config = load(["--server", "https://x", "--target-dir", "conf", "--state-dir", "st"], {})

    assert config.target_dir == os.path.join(str(tmp_path), "conf")
    assert config.state_dir == os.path.join(str(tmp_path), "st")


def test_defaults_when_only_the_required_options_are_given():
    config = load(REQUIRED, {})

    assert config.token is None and config.enrollment_token is None
    assert config.labels == {}
    assert (config.validate_command, config.reload_command, config.start_command) == (
        None, None, None)
    assert config.command_timeout == 120.0 and config.poll_interval is None
    assert config.once is False and config.log_level == "INFO"
    assert config.name and config.name == config.name.lower() and "." not in config.name


def test_once_flag():
    assert load([*REQUIRED, "--once"], {}).once is True


def test_numbers_are_parsed_and_checked():
    config = load([*REQUIRED, "--command-timeout", "2.5", "--poll-interval", "15"], {})

    assert (config.command_timeout, config.poll_interval) == (2.5, 15.0)
    with pytest.raises(ConfigError, match="--poll-interval must be a number of seconds, "
                                          "not 'soon'"):
        load([*REQUIRED, "--poll-interval", "soon"], {})
    with pytest.raises(ConfigError, match="at least 1 second"):
        load([*REQUIRED, "--poll-interval", "0.5"], {})


def test_an_empty_poll_interval_means_the_servers():
    assert load(REQUIRED, {"BELLWETHER_POLL_INTERVAL": ""}).poll_interval is None


@pytest.mark.parametrize("text, labels", [
    ("role=web,zone=eu-1", {"role": "web", "zone": "eu-1"}),
    (" role = web , zone=eu-1 ,", {"role": "web", "zone": "eu-1"}),
    ("a=b,,c=d", {"a": "b", "c": "d"}),
    ("empty=", {"empty": ""}),
    ("k=v=w", {"k": "v=w"}),
    ("", {}),
    (None, {}),
])
def test_labels_parse_key_value_pairs(text, labels):
    assert parse_labels(text) == labels


@pytest.mark.parametrize("text", ["role", "role=web,zone", "=web", " =web"])
def test_labels_without_key_or_equals_sign_are_a_config_error(text):
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_labels(text)


def test_labels_from_flags_are_parsed():
    assert load([*REQUIRED, "--labels", "role=web"], {}).labels == {"role": "web"}
