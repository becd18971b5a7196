"""`quarry lab report`: the campaign's written report, printed, or written as Markdown or self-contained HTML.

The report is the writer's (WriteCampaignReport); its plot is drawn here from the ledger by the plotting
code of `quarry lab plot`, as an SVG: beside a Markdown file, inline in an HTML one. The Markdown comes from a
model, so it is cleaned of escape sequences before it is printed, and rendered to HTML with raw HTML off
(whatever markup it holds is shown as text).
"""

from __future__ import annotations

import html
import io
import sys
import uuid
from pathlib import Path

import grpc
from markdown_it import MarkdownIt

from quarry.cli.terminal import clean
from quarry.clients.campaigns import CampaignsClient
from quarry.v1 import campaign_pb2

# The exit status when the writer's prose was left out (its figures did not match the ledger).
UNCHECKED = 3

_STYLE = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; } th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; }
blockquote { border-left: 4px solid #c33; margin: 0; padding-left: 1rem; color: #633; }
figure { margin: 1.5rem 0; } svg { max-width: 100%; height: auto; }
"""


async def report(client: CampaignsClient, campaign_id: str, output: Path | None, *, new: bool, request_id: str) -> int:
    written = None if new else await _latest(client, campaign_id)
    if written is None:
        print("the writer is writing the report from the ledger…", file=sys.stderr)
        written = await client.write_campaign_report(campaign_id, request_id=request_id or str(uuid.uuid4()))
    if output is None:
        print(clean(written.markdown), end="")
    else:
        campaign = await client.get_campaign(campaign_id)
        save(written, campaign, await client.ledger(campaign_id), output)
    if not written.checked:
        problems = "; ".join(clean(problem) for problem in written.problems[:5])
        print(f"the writer's text was left out: {problems}", file=sys.stderr)
        return UNCHECKED
    return 0


def save(
    written: campaign_pb2.CampaignReport,
    campaign: campaign_pb2.Campaign,
    rows: list[campaign_pb2.LedgerRow],
    output: Path,
) -> None:
    """The report at `output`: one HTML file, or Markdown with its plot as an SVG beside it."""
    plot = _plot_svg(campaign, rows)
    if output.suffix.lower() in (".html", ".htm"):
        output.write_text(to_html(written.markdown, plot, title=campaign.spec.title or campaign.campaign_id))
    else:
        image = output.with_name(f"{output.stem}-plot.svg")
        image.write_text(plot)
        output.write_text(f"{written.markdown}\n![the metric per cycle]({image.name})\n")
        print(f"wrote {image}", file=sys.stderr)
    print(f"wrote {output}", file=sys.stderr)


def to_html(markdown: str, plot_svg: str, *, title: str) -> str:
    """One HTML file with the report and its plot inline: no script, no remote resource."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}"
        f"<figure>{plot_svg}<figcaption>The metric per cycle, the running best and its noise band."
        "</figcaption></figure>\n</body></html>\n"
    )


async def _latest(client: CampaignsClient, campaign_id: str) -> campaign_pb2.CampaignReport | None:
    try:
        return await client.get_campaign_report(campaign_id)
    except grpc.aio.AioRpcError as error:
        if error.code() is grpc.StatusCode.NOT_FOUND:  # none yet (or no such campaign: writing one says so)
            return None
        raise


def _plot_svg(campaign: campaign_pb2.Campaign, rows: list[campaign_pb2.LedgerRow]) -> str:
    from quarry.cli.lab.plot import plot_ledger  # matplotlib is slow to import: only here

    buffer = io.BytesIO()
    title = f"{campaign.spec.title or campaign.spec.brief.goal[:60]} ({campaign.campaign_id})"
    plot_ledger(rows, campaign.spec.metric, buffer, title=title, image_format="svg")
    text = buffer.getvalue().decode()
    return text[text.index("<svg") :]  # inline: without the XML declaration and doctype
