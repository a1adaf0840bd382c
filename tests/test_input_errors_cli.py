"""Bad input as a user types it: one line saying what is wrong and what works, exit status 2, no traceback, and
nothing written before the check."""

from pathlib import Path

from click.testing import CliRunner

from servesim.cli import main


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result, *fragments: str) -> str:
    """The one error line of a refused command, after checking the exit status and that no traceback came out."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# Files that are not UTF-8 ---------------------------------------------------------------------------------------

def test_latin1_trace_is_refused_with_its_line(tmp_path: Path):
    trace = tmp_path / "l1.csv"
    trace.write_bytes(b"arrival_s,prompt_tokens,output_tokens,note\n0,100,10,caf\xe9\n")
    refused(run("workload", trace), "line 2 is not UTF-8", "0xe9")


def test_latin1_jsonl_trace_is_refused(tmp_path: Path):
    trace = tmp_path / "l1.jsonl"
    trace.write_bytes(b'{"prompt_tokens": 1, "output_tokens": 2, "note": "caf\xe9"}\n')
    refused(run("workload", trace), "line 1 is not UTF-8")


def test_latin1_price_file_is_refused(tmp_path: Path):
    prices = tmp_path / "p.csv"
    prices.write_bytes(b"gpu,usd_per_gpu_hour,date\nH100,2.0,caf\xe9\n")
    refused(run("plan", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--quick", "--prices", prices),
            "line 2 is not UTF-8")


def test_latin1_model_config_is_refused(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_bytes(b'{"hidden_size": 4096, "name": "caf\xe9"}')
    refused(run("plan", "--model", config, "--quick"), "line 1 is not UTF-8")
