"""A renderer from another package, registered through the `renderctl.renderers` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from pypdf import PdfReader

PLUGIN = textwrap.dedent('''
    from renderctl.render.base import ParamSpec, RendererSpec

    SPEC = RendererSpec(
        kind="hello",
        target="hello_plugin:render",
        description="A one-page greeting.",
        min_inputs=0,
        max_inputs=0,
        params=(ParamSpec("name", "str", required=True, description="who to greet"),),
    )


    def render(inputs, output, params):
        from reportlab.pdfgen import canvas

        c = canvas.Canvas(str(output))
        c.drawString(72, 720, f"Hello, {params['name']}")
        c.showPage()
        c.save()
''')


def install_plugin(site: Path) -> None:
    """A minimal installed distribution: a module plus dist-info with its entry point."""
    (site / "hello_plugin.py").write_text(PLUGIN)
    info = site / "hello_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[renderctl.renderers]\nhello = hello_plugin:SPEC\n")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "renderctl.cli.app", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_a_plugin_renderer_is_listed_validated_and_run(tmp_path: Path) -> None:
    # Given a package that registers the kind "hello"
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    env = {**os.environ, "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    # Then `kinds` lists it with its params
    kinds = json.loads(cli("kinds", "--json", env=env).stdout)
    assert kinds["hello"]["params"][0]["name"] == "name"
    assert kinds["hello"]["inputs"] == [0, 0]  # (its own limit; review CJ: [0, 1000])

    # And a manifest that forgets its required param is refused, naming the field
    bad = tmp_path / "bad.toml"
    bad.write_text('[[jobs]]\nid = "h"\nkind = "hello"\noutput = "h.pdf"\n')
    res = cli("validate", str(bad), env=env)
    assert res.returncode == 2 and "params.name" in res.stderr

    # And a good one runs in the workers and publishes a real PDF
    good = tmp_path / "good.toml"
    good.write_text('[[jobs]]\nid = "h"\nkind = "hello"\noutput = "h.pdf"\n'
                    'params = { name = "plugins" }\n')
    res = cli("run", str(good), "--queue", str(tmp_path / "q"), "--out", str(tmp_path / "out"),
              "--workers", "1", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    text = PdfReader(tmp_path / "out" / "h.pdf").pages[0].extract_text()
    assert "Hello, plugins" in text


def test_kinds_names_a_plugin_that_cannot_be_loaded(tmp_path: Path) -> None:
    # Given an installed plugin whose module fails to import, and a working one
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    (site / "broken_plugin.py").write_text("raise ImportError('needs libfoo')\n")
    info = site / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[renderctl.renderers]\nbroken = broken_plugin:SPEC\n")
    env = {**os.environ, "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    # When the renderers are listed
    res = cli("kinds", "--json", env=env)

    # Then the working plugin is listed, and the broken one is named on stderr with why
    # (it was silently absent), the list on stdout still what scripts read
    assert res.returncode == 0, res.stderr
    assert "hello" in json.loads(res.stdout)
    assert "warning: renderer plugin broken (broken_plugin:SPEC): ImportError: needs " \
        "libfoo; its kind is not available" in res.stderr, res.stderr



def test_kinds_names_a_plugin_whose_kind_is_taken(tmp_path: Path) -> None:
    # Given a plugin that registers "invoice" (a built-in's kind), and two that register
    # "hello"
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site)
    for name, kind in (("shadow", "invoice"), ("again", "hello")):
        (site / f"{name}_plugin.py").write_text(PLUGIN.replace('kind="hello"', f'kind="{kind}"'))
        info = site / f"{name}_plugin-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\n"
                                       "Version: 0.1\n")
        (info / "entry_points.txt").write_text(
            f"[renderctl.renderers]\n{name} = {name}_plugin:SPEC\n")
    env = {**os.environ, "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    # When the renderers are listed
    res = cli("kinds", "--json", env=env)

    # Then the built-in keeps its kind, one "hello" is registered, and the plugins left
    # out are named on stderr with why (before: ignored without a word, audit BQ)
    assert res.returncode == 0, res.stderr
    kinds = json.loads(res.stdout)
    assert kinds["invoice"]["description"].startswith("An invoice from a JSON document")
    assert "warning: renderer plugin shadow (shadow_plugin:SPEC): kind 'invoice' is a " \
        "built-in renderer's already; this one is not registered" in res.stderr, res.stderr
    assert res.stderr.count("kind 'hello' is another plugin (hello_plugin:render)'s already"
                            ) + res.stderr.count("kind 'hello' is another plugin "
                                                 "(again_plugin:render)'s already") == 1, res.stderr
