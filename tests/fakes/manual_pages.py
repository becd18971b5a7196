# ruff: noqa: E501  (the HTML keeps the generator's long lines; breaking them would change the text)
"""Pages shaped like a real database manual (DocBook HTML, as the PostgreSQL documentation is published).

Their shapes are the ones trafilatura got wrong on the real 1,169-page manual: inline code with
nested replaceable parts (`<code>varchar(<em><code>n</code></em>)</code>`), section headings
nested in `div.titlepage > div > div` with a permalink anchor, admonition headings, and the
navigation header and footer tables around every page. Each page lists what a reader must get:
its headings in order, and sentences quoted from it as a person reading the page would copy them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ManualPage:
    path: str
    html: str
    title: str
    headings: tuple[str, ...]  # every h1-h6 of the content, in document order, as shown
    quotes: tuple[str, ...]  # sentences as they read on the rendered page
    phrases: tuple[str, ...]  # what the in-page search must find
    boilerplate: tuple[str, ...]  # navigation text that must not be extracted


CHARACTER_TYPES = ManualPage(
    path="/docs/17/datatype-character.html",
    html="""<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml"><head><meta http-equiv="Content-Type" content="text/html; charset=UTF-8" /><title>8.3. Character Types</title><link rel="stylesheet" type="text/css" href="stylesheet.css" /><meta name="generator" content="DocBook XSL Stylesheets Vsnapshot" /><link rel="prev" href="datatype-money.html" title="8.2. Monetary Types" /><link rel="next" href="datatype-binary.html" title="8.4. Binary Data Types" /></head><body id="docContent" class="container-fluid col-10"><div class="navheader"><table width="100%" summary="Navigation header"><tr><th colspan="5" align="center">8.3. Character Types</th></tr><tr><td width="10%" align="left"><a accesskey="p" href="datatype-money.html" title="8.2. Monetary Types">Prev</a> </td><td width="10%" align="left"><a accesskey="u" href="datatype.html" title="Chapter 8. Data Types">Up</a></td><th width="60%" align="center">Chapter 8. Data Types</th><td width="10%" align="right"><a accesskey="h" href="index.html" title="PostgreSQL 17.2 Documentation">Home</a></td><td width="10%" align="right"> <a accesskey="n" href="datatype-binary.html" title="8.4. Binary Data Types">Next</a></td></tr></table><hr /></div><div class="sect1" id="DATATYPE-CHARACTER"><div class="titlepage"><div><div><h2 class="title" style="clear: both">8.3. Character Types <a href="#DATATYPE-CHARACTER" class="id_link">#</a></h2></div></div></div><a id="id-1.5.7.11.2" class="indexterm"></a><div class="table" id="DATATYPE-CHARACTER-TABLE"><p class="title"><strong>Table 8.4. Character Types</strong></p><div class="table-contents"><table class="table" summary="Character Types" border="1"><colgroup><col /><col /></colgroup><thead><tr><th>Name</th><th>Description</th></tr></thead><tbody><tr><td><code class="type">character varying(<em class="replaceable"><code>n</code></em>)</code>, <code class="type">varchar(<em class="replaceable"><code>n</code></em>)</code></td><td>variable-length with limit</td></tr><tr><td><code class="type">character(<em class="replaceable"><code>n</code></em>)</code>, <code class="type">char(<em class="replaceable"><code>n</code></em>)</code>, <code class="type">bpchar(<em class="replaceable"><code>n</code></em>)</code></td><td>fixed-length, blank-padded</td></tr><tr><td><code class="type">text</code></td><td>variable unlimited length</td></tr></tbody></table></div></div><br class="table-break" /><p>
    <acronym class="acronym">SQL</acronym> defines two primary character types:
    <code class="type">character varying(<em class="replaceable"><code>n</code></em>)</code> and
    <code class="type">character(<em class="replaceable"><code>n</code></em>)</code>, where <em class="replaceable"><code>n</code></em>
    is a positive integer.  Both of these types can store strings up to
    <em class="replaceable"><code>n</code></em> characters (not bytes) in length.  An attempt to store a
    longer string into a column of these types will result in an
    error, unless the excess characters are all spaces, in which case
    the string will be truncated to the maximum length.
   </p><p>
    The notations <code class="type">varchar(<em class="replaceable"><code>n</code></em>)</code> and
    <code class="type">char(<em class="replaceable"><code>n</code></em>)</code> are aliases for <code class="type">character
    varying(<em class="replaceable"><code>n</code></em>)</code> and
    <code class="type">character(<em class="replaceable"><code>n</code></em>)</code>, respectively.
   </p><div class="sect2" id="DATATYPE-CHARACTER-STORAGE"><div class="titlepage"><div><div><h3 class="title">8.3.1. Storage of Character Data <a href="#DATATYPE-CHARACTER-STORAGE" class="id_link">#</a></h3></div></div></div><p>
    The storage requirement for a short string (up to 126 bytes) is 1 byte
    plus the actual string, which includes the space padding in the case of
    <code class="type">character</code>.  Longer strings have 4 bytes of overhead instead
    of 1.  Long strings are compressed by the system automatically, so
    the physical requirement on disk might be less.
   </p><div class="tip"><h3 class="title">Tip</h3><p>
     There is no performance difference among these three types,
     apart from increased storage space when using the blank-padded
     type.  Prefer <code class="type">varchar(<em class="replaceable"><code>n</code></em>)</code> than to <code class="type">char(<em class="replaceable"><code>n</code></em>)</code> in new schemas, because the padding is rarely wanted.
    </p></div></div><div class="sect2" id="DATATYPE-CHARACTER-SPECIAL"><div class="titlepage"><div><div><h3 class="title">8.3.2. Special Character Types <a href="#DATATYPE-CHARACTER-SPECIAL" class="id_link">#</a></h3></div></div></div><p>
    There are two other fixed-length character types in
    <span class="productname">PostgreSQL</span>, shown in the table below.  The
    <code class="type">name</code> type exists <span class="emphasis"><em>only</em></span> for the storage of identifiers
    in the internal system catalogs and is not intended for use by the general user.
   </p></div></div><div class="navfooter"><hr /><table width="100%" summary="Navigation footer"><tr><td width="40%" align="left"><a accesskey="p" href="datatype-money.html">Prev</a> </td><td width="20%" align="center"><a accesskey="u" href="datatype.html">Up</a></td><td width="40%" align="right"> <a accesskey="n" href="datatype-binary.html">Next</a></td></tr><tr><td width="40%" align="left" valign="top">8.2. Monetary Types </td><td width="20%" align="center"><a accesskey="h" href="index.html">Home</a></td><td width="40%" align="right" valign="top"> 8.4. Binary Data Types</td></tr></table></div></body></html>
""",
    title="8.3. Character Types",
    headings=(
        "8.3. Character Types",
        "8.3.1. Storage of Character Data",
        "Tip",
        "8.3.2. Special Character Types",
    ),
    quotes=(
        "SQL defines two primary character types: character varying(n) and character(n), where n is a positive integer.",
        "The notations varchar(n) and char(n) are aliases for character varying(n) and character(n), respectively.",
        "Prefer varchar(n) than to char(n) in new schemas, because the padding is rarely wanted.",
        "Both of these types can store strings up to n characters (not bytes) in length.",
        "Longer strings have 4 bytes of overhead instead of 1.",
    ),
    phrases=("varchar(n) than to char(n)", "character varying(n), varchar(n)", "bpchar(n)"),
    boilerplate=("Prev", "Next", "Chapter 8. Data Types", "8.2. Monetary Types", "8.4. Binary Data Types"),
)

CREATE_SEQUENCE = ManualPage(
    path="/docs/17/sql-createsequence.html",
    html="""<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml"><head><meta http-equiv="Content-Type" content="text/html; charset=UTF-8" /><title>CREATE SEQUENCE</title><link rel="stylesheet" type="text/css" href="stylesheet.css" /><meta name="generator" content="DocBook XSL Stylesheets Vsnapshot" /></head><body id="docContent" class="container-fluid col-10"><div class="navheader"><table width="100%" summary="Navigation header"><tr><th colspan="5" align="center">CREATE SEQUENCE</th></tr><tr><td width="10%" align="left"><a accesskey="p" href="sql-createschema.html" title="CREATE SCHEMA">Prev</a> </td><td width="10%" align="left"><a accesskey="u" href="sql-commands.html" title="SQL Commands">Up</a></td><th width="60%" align="center">SQL Commands</th><td width="10%" align="right"><a accesskey="h" href="index.html" title="PostgreSQL 17.2 Documentation">Home</a></td><td width="10%" align="right"> <a accesskey="n" href="sql-createserver.html" title="CREATE SERVER">Next</a></td></tr></table><hr /></div><div class="refentry" id="SQL-CREATESEQUENCE"><div class="titlepage"></div><a id="id-1.9.3.81.1" class="indexterm"></a><div class="refnamediv"><h2><span class="refentrytitle">CREATE SEQUENCE</span></h2><p>CREATE SEQUENCE &#8212; define a new sequence generator</p></div><div class="refsynopsisdiv"><h2>Synopsis</h2><pre class="synopsis">
CREATE [ { TEMPORARY | TEMP } | UNLOGGED ] SEQUENCE [ IF NOT EXISTS ] <em class="replaceable"><code>name</code></em>
    [ AS <em class="replaceable"><code>data_type</code></em> ]
    [ INCREMENT [ BY ] <em class="replaceable"><code>increment</code></em> ]
</pre></div><div class="refsect1" id="id-1.9.3.81.5"><h2>Description <a href="#id-1.9.3.81.5" class="id_link">#</a></h2><p>
   <code class="command">CREATE SEQUENCE</code> creates a new sequence number
   generator.  This involves creating and initializing a new special
   single-row table with the name <em class="replaceable"><code>name</code></em>.
   The generator will be owned by the user issuing the command.
  </p><p>
   After a sequence is created, you use the functions
   <code class="function">nextval</code>,
   <code class="function">currval</code>, and
   <code class="function">setval</code>
   to operate on the sequence.  These functions are documented in
   <a class="xref" href="functions-sequence.html" title="9.17. Sequence Manipulation Functions">Section&#160;9.17</a>.
  </p></div><div class="refsect1" id="id-1.9.3.81.6"><h2>Parameters <a href="#id-1.9.3.81.6" class="id_link">#</a></h2><div class="variablelist"><dl class="variablelist"><dt><span class="term"><code class="literal">TEMPORARY</code> or <code class="literal">TEMP</code></span></dt><dd><p>
        If specified, the sequence object is created only for this
        session, and is automatically dropped on session exit.
       </p></dd><dt><span class="term"><em class="replaceable"><code>increment</code></em></span></dt><dd><p>
        The optional clause <code class="literal">INCREMENT BY <em class="replaceable"><code>increment</code></em></code>
        specifies which value is added to the current sequence value to
        create a new value.  A positive value will make an ascending
        sequence, a negative one a descending sequence.  The default
        value is 1.
       </p></dd></dl></div></div><div class="refsect1" id="id-1.9.3.81.7"><h2>Notes <a href="#id-1.9.3.81.7" class="id_link">#</a></h2><p>
   Use <code class="command">DROP SEQUENCE</code> to remove a sequence.
  </p><p>
   Sequences are based on <code class="type">bigint</code> arithmetic, so the range
   cannot exceed the range of an eight-byte integer.
  </p></div><div class="refsect1" id="id-1.9.3.81.8"><h2>Examples <a href="#id-1.9.3.81.8" class="id_link">#</a></h2><p>
   Create an ascending sequence called <code class="literal">serial</code>, starting at 101:
</p><pre class="programlisting">
CREATE SEQUENCE serial START 101;
</pre></div></div><div class="navfooter"><hr /><table width="100%" summary="Navigation footer"><tr><td width="40%" align="left"><a accesskey="p" href="sql-createschema.html">Prev</a> </td><td width="20%" align="center"><a accesskey="u" href="sql-commands.html">Up</a></td><td width="40%" align="right"> <a accesskey="n" href="sql-createserver.html">Next</a></td></tr><tr><td width="40%" align="left" valign="top">CREATE SCHEMA </td><td width="20%" align="center"><a accesskey="h" href="index.html">Home</a></td><td width="40%" align="right" valign="top"> CREATE SERVER</td></tr></table></div></body></html>
""",
    title="CREATE SEQUENCE",
    headings=("CREATE SEQUENCE", "Synopsis", "Description", "Parameters", "Notes", "Examples"),
    quotes=(
        "This involves creating and initializing a new special single-row table with the name name.",
        "The optional clause INCREMENT BY increment specifies which value is added to the current sequence value"
        " to create a new value.",
        "[ AS data_type ] [ INCREMENT [ BY ] increment ]",
        "Sequences are based on bigint arithmetic, so the range cannot exceed the range of an eight-byte integer.",
    ),
    phrases=("INCREMENT BY increment specifies", "[ AS data_type ]", "SEQUENCE [ IF NOT EXISTS ] name"),
    boilerplate=("Prev", "Next", "SQL Commands", "CREATE SCHEMA", "CREATE SERVER"),
)

MANUAL = (CHARACTER_TYPES, CREATE_SEQUENCE)
