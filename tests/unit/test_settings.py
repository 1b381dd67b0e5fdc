"""Service settings: flag > environment > default, conversion errors that name the knob, secrets never as flags."""

import argparse
from dataclasses import dataclass

import pytest

from services.runtime.common_settings import CommonSettings
from services.runtime.settings_schema import SettingsError, add_arguments, markdown_table, resolve, setting


@dataclass(frozen=True, slots=True)
class Example(CommonSettings):
    port: int = setting(8000, "port")
    ratio: float = setting(0.5, "a ratio")
    verbose: bool = setting(False, "more output")
    mode: str = setting("allow", "a mode", choices=("allow", "fail"))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example)
    return parser.parse_args(argv)


def test_flag_beats_environment_beats_default():
    env = {"VOXMESH_PORT": "9000", "VOXMESH_RATIO": "0.25"}
    settings = resolve(Example, parse(["--port", "9100"]), env)
    assert settings.port == 9100
    assert settings.ratio == 0.25
    assert settings.mode == "allow"
    assert settings.nats_url == "nats://127.0.0.1:4222"


def test_bad_values_name_the_flag_and_variable():
    with pytest.raises(SettingsError, match=r"--port / VOXMESH_PORT: expected int, got 'eighty'"):
        resolve(Example, parse(["--port", "eighty"]), {})
    with pytest.raises(SettingsError, match=r"--mode / VOXMESH_MODE: 'sometimes' is not one of allow, fail"):
        resolve(Example, None, {"VOXMESH_MODE": "sometimes"})
    with pytest.raises(SettingsError, match="VOXMESH_VERBOSE"):
        resolve(Example, None, {"VOXMESH_VERBOSE": "perhaps"})


def test_booleans_from_the_environment():
    assert resolve(Example, None, {"VOXMESH_VERBOSE": "yes"}).verbose is True
    assert resolve(Example, None, {"VOXMESH_VERBOSE": "0"}).verbose is False


def test_secrets_have_no_flag_and_come_from_env_or_file(tmp_path):
    with pytest.raises(SystemExit):
        parse(["--nats-token", "s3cret"])
    assert resolve(Example, None, {"VOXMESH_NATS_TOKEN": "from-env"}).nats_token == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert resolve(Example, None, {"VOXMESH_NATS_TOKEN_FILE": str(token_file)}).nats_token == "from-file"
    with pytest.raises(SettingsError, match="VOXMESH_NATS_TOKEN_FILE=.*cannot read"):
        resolve(Example, None, {"VOXMESH_NATS_TOKEN_FILE": str(tmp_path / "missing")})


def test_markdown_table_lists_every_setting():
    table = markdown_table(Example)
    for name in ("`--nats-url`", "`VOXMESH_PORT`", "`VOXMESH_NATS_TOKEN` or `VOXMESH_NATS_TOKEN_FILE`"):
        assert name in table


def test_a_switch_interval_out_of_range_stops_the_service_before_it_connects(capsys):
    from services.runtime.process import EXIT_USAGE, main

    assert main("decode", ["--switch-interval-ms", "0", "--nats-url", "nats://127.0.0.1:1"]) == EXIT_USAGE
    assert "--switch-interval-ms / VOXMESH_SWITCH_INTERVAL_MS: must be between 0.01 and 1000 ms, got 0.0" in \
        capsys.readouterr().err


def test_the_device_trace_is_a_setting_of_every_service():
    """The trace folder and window length come from the settings (flag or variable of the same name), not from a
    variable the hook reads itself; a window that cannot record stops the service before it connects."""
    from services.runtime.common_settings import CommonSettings

    settings = resolve(CommonSettings, None, {"VOXMESH_DEVICE_TRACE_DIR": "/tmp/traces",
                                              "VOXMESH_DEVICE_TRACE_S": "2.5"})
    assert (settings.device_trace_dir, settings.device_trace_s) == ("/tmp/traces", 2.5)
    assert resolve(CommonSettings, None, {}).device_trace_dir is None


def test_a_device_trace_window_of_no_length_stops_the_service_before_it_connects(capsys):
    from services.runtime.process import EXIT_USAGE, main

    assert main("vocoder", ["--device-trace-s", "0", "--nats-url", "nats://127.0.0.1:1"]) == EXIT_USAGE
    assert "--device-trace-s / VOXMESH_DEVICE_TRACE_S: must be more than 0 and at most 600 s, got 0.0" in \
        capsys.readouterr().err
