"""attnlab-report's Jinja2 templates; a package so that an installed attnlab finds them (attnlab.report_templates)."""
