/* Native scanner for the event array of a Chrome Trace Event Format file.
 *
 * One pass over the text of the array (between its brackets) that validates it as JSON and
 * lays the events' fields out as Arrow-ready column buffers: no Python object per event.
 * It covers the events real profilers write: `scan` returns None for anything outside that
 * subset (an escaped key, a string pid, an exponent in a time, a missing ts, a duplicate key,
 * invalid JSON or UTF-8, ...), and the Python decoder (chrome.py) then decides, with its own
 * error messages. On what it accepts it gives exactly the columns the Python decoder gives.
 *
 * scan(buffer, lo, hi) -> tuple | None
 *     The events in buffer[lo:hi], a run of comma-separated JSON objects (possibly none).
 *     The GIL is released while scanning, so two threads scan two halves side by side.
 *     Returned: (n, ph_off, ph_data, name_bits, name_nulls, name_off, name_data, cat_bits,
 *     cat_nulls, cat_off, cat_data, pid, tid, ts_ns, has_ts, dur_ns, dur_bits, dur_nulls,
 *     id_bits, id_nulls, id_off, id_data, args_bits, args_nulls, args_off, args_data,
 *     keys, entries): offsets are int32, bits are Arrow validity bitmaps (LSB first), pid /
 *     tid / ts_ns / dur_ns int64, has_ts one byte per event; keys is the list of the other
 *     (non-column) keys seen, as their bytes, in order of first appearance after "bp" and "s";
 *     entries packs (event, key index, value start, value end) as int64s for them; strids
 *     packs (event, 0 for pid or 1 for tid, value start, value end) for string pids / tids,
 *     which are 0 in their columns.
 *
 * extras(buffer, n, parts, names) -> (bits, nulls, off, data) | None
 *     The `extra` column: per event a JSON object of its other keys, the values verbatim, in
 *     the order of `names` (the keys of all parts in order of first appearance); parts is a
 *     list of (first event, entries, key map) with key map an int64 array from a part's key
 *     index to its index in `names`. None when the text would pass 2 GiB (a string array's
 *     most).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef const unsigned char *cp;

#define MAX_DEPTH 48       /* deeper values: the Python decoder decides */
#define MAX_KEYS 200       /* distinct other keys: more, and the Python decoder decides */
#define MAX_US 9223372036854775LL  /* 2**63 // 1000: |us| at or beyond this overflows ns */

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 1 << 14;
    while (cap < b->len + extra) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return 0;
    b->p = q;
    b->cap = cap;
    return 1;
}

static inline int put(Buf *b, const void *src, size_t n) {
    if (!reserve(b, n)) return 0;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 1;
}

static inline int put_i64(Buf *b, int64_t v) { return put(b, &v, 8); }
static inline int put_i32(Buf *b, int32_t v) { return put(b, &v, 4); }
static inline int put_u8(Buf *b, unsigned char v) { return put(b, &v, 1); }

/* A validity bitmap grown one bit at a time. */
typedef struct {
    Buf bits;
    int64_t n, nulls;
} Bits;

static inline int put_bit(Bits *v, int valid) {
    if ((v->n & 7) == 0 && !put_u8(&v->bits, 0)) return 0;
    if (valid) v->bits.p[v->n >> 3] |= (char)(1 << (v->n & 7));
    else v->nulls++;
    v->n++;
    return 1;
}

/* A string column: validity, int32 offsets, bytes. */
typedef struct {
    Bits valid;
    Buf off, data;
} StrCol;

static int str_init(StrCol *c) { return put_i32(&c->off, 0); }

static inline int str_end(StrCol *c, int valid) {
    if (c->data.len > INT32_MAX) return 0;  /* beyond a string array: the Python decoder decides */
    return put_bit(&c->valid, valid) && put_i32(&c->off, (int32_t)c->data.len);
}

/* ------------------------------------------------------------------ JSON grammar */

static inline cp ws(cp p, cp e) {
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The code unit of a \uXXXX escape at p, or 0x10000 when p holds none. */
static uint32_t hex4(cp p, cp e) {
    if (e - p < 6 || p[0] != '\\' || p[1] != 'u') return 0x10000;
    uint32_t u = 0;
    for (int i = 2; i < 6; i++) {
        int h = hexval(p[i]);
        if (h < 0) return 0x10000;
        u = (u << 4) | (uint32_t)h;
    }
    return u;
}

/* Past one multi-byte UTF-8 sequence at p, or NULL if it is not valid UTF-8 (overlong forms,
 * surrogates and code points beyond U+10FFFF are not). */
static cp utf8_seq(cp p, cp e) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (p + 2 > e || (p[1] & 0xC0) != 0x80) return NULL;
        return p + 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (p + 3 > e || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return NULL;
        if (c == 0xE0 && p[1] < 0xA0) return NULL;
        if (c == 0xED && p[1] >= 0xA0) return NULL;
        return p + 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (p + 4 > e || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return NULL;
        if (c == 0xF0 && p[1] < 0x90) return NULL;
        if (c == 0xF4 && p[1] >= 0x90) return NULL;
        return p + 4;
    }
    return NULL;
}

/* p at a string's opening quote: past its closing quote, or NULL. *esc is set if it has an
 * escape sequence. */
static cp scan_string(cp p, cp e, int *esc) {
    p++;
    for (;;) {
        while (p < e && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= e) return NULL;
        unsigned char c = *p;
        if (c == '"') return p + 1;
        if (c == '\\') {
            *esc = 1;
            if (p + 1 >= e) return NULL;
            unsigned char d = p[1];
            if (d == 'u') {
                uint32_t u = hex4(p, e);
                if (u > 0xFFFF) return NULL;
                p += 6;
                /* A surrogate must be a high one followed by a low one (the Python decoder
                 * refuses lone ones, in verbatim values too). */
                if (u >= 0xDC00 && u <= 0xDFFF) return NULL;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    uint32_t lo = hex4(p, e);
                    if (lo < 0xDC00 || lo > 0xDFFF) return NULL;
                    p += 6;
                }
            } else if (d == '"' || d == '\\' || d == '/' || d == 'b' || d == 'f' || d == 'n' || d == 'r' || d == 't') {
                p += 2;
            } else {
                return NULL;
            }
        } else if (c < 0x20) {
            return NULL;
        } else {
            p = utf8_seq(p, e);
            if (!p) return NULL;
        }
    }
}

/* A string's content [s+1, end-1) with its escapes decoded, appended to out; 0 on a lone
 * surrogate (the Python decoder decides those). */
static int unescape(cp s, cp end, Buf *out) {
    cp p = s + 1, e = end - 1;
    while (p < e) {
        cp q = p;
        while (q < e && *q != '\\') q++;
        if (q > p && !put(out, p, (size_t)(q - p))) return 0;
        if (q >= e) break;
        unsigned char d = q[1];
        char c;
        if (d == 'u') {
            uint32_t u = (uint32_t)((hexval(q[2]) << 12) | (hexval(q[3]) << 8) | (hexval(q[4]) << 4) | hexval(q[5]));
            q += 6;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (q + 6 > e || q[0] != '\\' || q[1] != 'u') return 0;
                uint32_t lo = (uint32_t)((hexval(q[2]) << 12) | (hexval(q[3]) << 8) | (hexval(q[4]) << 4) | hexval(q[5]));
                if (lo < 0xDC00 || lo > 0xDFFF) return 0;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                q += 6;
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
                return 0;
            }
            unsigned char b[4];
            size_t n;
            if (u < 0x80) { b[0] = (unsigned char)u; n = 1; }
            else if (u < 0x800) { b[0] = (unsigned char)(0xC0 | (u >> 6)); b[1] = (unsigned char)(0x80 | (u & 0x3F)); n = 2; }
            else if (u < 0x10000) {
                b[0] = (unsigned char)(0xE0 | (u >> 12)); b[1] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
                b[2] = (unsigned char)(0x80 | (u & 0x3F)); n = 3;
            } else {
                b[0] = (unsigned char)(0xF0 | (u >> 18)); b[1] = (unsigned char)(0x80 | ((u >> 12) & 0x3F));
                b[2] = (unsigned char)(0x80 | ((u >> 6) & 0x3F)); b[3] = (unsigned char)(0x80 | (u & 0x3F)); n = 4;
            }
            if (!put(out, b, n)) return 0;
            p = q;
            continue;
        }
        switch (d) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        default: c = (char)d;  /* " \ / */
        }
        if (!put(out, &c, 1)) return 0;
        p = q + 2;
    }
    return 1;
}

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* p at a number: past it, or NULL. *is_int: no fraction and no exponent. */
static cp scan_number(cp p, cp e, int *is_int) {
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < e && is_digit(*p)) p++;
    else return NULL;
    *is_int = 1;
    if (p < e && *p == '.') {
        p++;
        *is_int = 0;
        if (p >= e || !is_digit(*p)) return NULL;
        while (p < e && is_digit(*p)) p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        *is_int = 0;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || !is_digit(*p)) return NULL;
        while (p < e && is_digit(*p)) p++;
    }
    return p;
}

static cp skip_value(cp p, cp e, int depth);

static cp skip_container(cp p, cp e, int depth, unsigned char close) {
    if (depth > MAX_DEPTH) return NULL;
    p = ws(p + 1, e);
    if (p < e && *p == close) return p + 1;
    for (;;) {
        if (close == '}') {
            int esc = 0;
            if (p >= e || *p != '"' || !(p = scan_string(p, e, &esc))) return NULL;
            p = ws(p, e);
            if (p >= e || *p != ':') return NULL;
            p = ws(p + 1, e);
        }
        if (!(p = skip_value(p, e, depth + 1))) return NULL;
        p = ws(p, e);
        if (p >= e) return NULL;
        if (*p == ',') { p = ws(p + 1, e); continue; }
        if (*p == close) return p + 1;
        return NULL;
    }
}

static inline cp literal(cp p, cp e, const char *word, size_t n) {
    return (size_t)(e - p) >= n && memcmp(p, word, n) == 0 ? p + n : NULL;
}

static cp skip_value(cp p, cp e, int depth) {
    int flag = 0;
    if (p >= e) return NULL;
    switch (*p) {
    case '"': return scan_string(p, e, &flag);
    case '{': return skip_container(p, e, depth, '}');
    case '[': return skip_container(p, e, depth, ']');
    case 't': return literal(p, e, "true", 4);
    case 'f': return literal(p, e, "false", 5);
    case 'n': return literal(p, e, "null", 4);
    default: return scan_number(p, e, &flag);
    }
}

/* ------------------------------------------------------------------ event fields */

enum { F_PH, F_NAME, F_CAT, F_PID, F_TID, F_TS, F_DUR, F_ID, F_ARGS, NFIELDS };

static int field_of(cp k, size_t n) {
    switch (n) {
    case 2:
        if (k[0] == 'p' && k[1] == 'h') return F_PH;
        if (k[0] == 't' && k[1] == 's') return F_TS;
        if (k[0] == 'i' && k[1] == 'd') return F_ID;
        return -1;
    case 3:
        if (!memcmp(k, "cat", 3)) return F_CAT;
        if (!memcmp(k, "pid", 3)) return F_PID;
        if (!memcmp(k, "tid", 3)) return F_TID;
        if (!memcmp(k, "dur", 3)) return F_DUR;
        return -1;
    case 4:
        if (!memcmp(k, "name", 4)) return F_NAME;
        if (!memcmp(k, "args", 4)) return F_ARGS;
        return -1;
    default:
        return -1;
    }
}

typedef struct {
    cp s, e;       /* the value's text; s == NULL: the event has no such key */
    int esc;       /* a string with escapes */
    int is_int;    /* a number without fraction or exponent */
} Val;

/* An integer's text (no fraction, no exponent) of at most 18 digits -> *out. */
static int small_int(cp s, cp e, int64_t *out) {
    int neg = *s == '-';
    cp p = s + neg;
    if (e - p > 18) return 0;
    int64_t v = 0;
    for (; p < e; p++) v = v * 10 + (*p - '0');
    *out = neg ? -v : v;
    return 1;
}

/* Microsecond digits -?[0-9]{1,16}(.[0-9]+)? (a JSON number or the text of a string) -> ns,
 * exact to 3 decimals and rounded half to even beyond, as the Python decoder does; 0 for
 * anything else (exponents, huge values: the Python decoder decides those, and words their
 * errors). */
static int fixed_us_to_ns(cp s, cp e, int64_t *out) {
    int neg = s < e && *s == '-';
    cp p = s + neg, d0 = p;
    int64_t whole = 0, frac = 0;
    while (p < e && is_digit(*p) && p - d0 < 17) whole = whole * 10 + (*p++ - '0');
    size_t nd = (size_t)(p - d0);
    if (nd == 0 || nd > 16 || whole > MAX_US) return 0;
    int fd = 0, first_cut = -1, rest = 0;
    if (p < e && *p == '.') {
        p++;
        while (p < e && is_digit(*p) && fd < 3) { frac = frac * 10 + (*p++ - '0'); fd++; }
        if (fd == 0) return 0;
        if (p < e && is_digit(*p)) first_cut = *p++ - '0';  /* beyond ns: rounded half to even */
        while (p < e && is_digit(*p)) rest |= *p++ != '0';
    }
    if (p != e) return 0;
    for (int i = fd; i < 3; i++) frac *= 10;
    int64_t ns = whole * 1000 + frac;  /* no overflow: whole <= MAX_US */
    if (first_cut > 5 || (first_cut == 5 && (rest || (ns & 1)))) {
        if (whole == MAX_US && frac >= 807) return 0;
        ns++;
    } else if (whole == MAX_US && frac > 807) {
        return 0;  /* beyond int64 ns */
    }
    *out = neg ? -ns : ns;
    return 1;
}

/* A ts / dur value -> (ns, present); 0 when outside the fast subset. */
static int time_ns(const Val *v, int64_t *ns, int *present) {
    if (!v->s || (*v->s == 'n')) {  /* absent or null */
        *ns = 0;
        *present = 0;
        return 1;
    }
    *present = 1;
    if (*v->s == '"') {
        if (v->esc) return 0;
        return fixed_us_to_ns(v->s + 1, v->e - 1, ns);
    }
    if (*v->s != '-' && !is_digit(*v->s)) return 0;  /* true, false, object, array */
    if (v->is_int) {
        int64_t us;
        if (!small_int(v->s, v->e, &us) || us >= MAX_US || us <= -MAX_US) return 0;
        *ns = us * 1000;
        return 1;
    }
    return fixed_us_to_ns(v->s, v->e, ns);
}

/* pid / tid: an integer, or 0 when absent or null; a string without escapes is 0 here and
 * listed (the caller names it, as the Python decoder does). */
static int id_int(const Val *v, int64_t *out, int *is_str) {
    *is_str = 0;
    if (!v->s || *v->s == 'n') { *out = 0; return 1; }
    if (*v->s == '"') {
        *out = 0;
        *is_str = 1;
        return !v->esc;
    }
    if ((*v->s != '-' && !is_digit(*v->s)) || !v->is_int) return 0;
    return small_int(v->s, v->e, out);
}

/* ph / name / cat / id as text: absent or null -> null; anything but a string -> 0. */
static int text_value(const Val *v, StrCol *c) {
    if (!v->s || *v->s == 'n') return str_end(c, 0);
    if (*v->s != '"') return 0;
    if (v->esc) {
        if (!unescape(v->s, v->e, &c->data)) return 0;
    } else if (!put(&c->data, v->s + 1, (size_t)(v->e - v->s - 2))) {
        return 0;
    }
    return str_end(c, 1);
}

typedef struct {
    cp s;
    size_t n;
} Key;

typedef struct {
    int64_t n;
    StrCol ph, name, cat, id, args;
    Buf pid, tid, ts, has_ts, dur, entries, strids;
    Bits dur_valid;
    Key keys[MAX_KEYS];
    int nkeys;
} Scan;

static int key_index(Scan *sc, cp k, size_t n) {
    for (int i = 0; i < sc->nkeys; i++)
        if (sc->keys[i].n == n && memcmp(sc->keys[i].s, k, n) == 0) return i;
    if (sc->nkeys >= MAX_KEYS) return -1;
    sc->keys[sc->nkeys].s = k;
    sc->keys[sc->nkeys].n = n;
    return sc->nkeys++;
}

/* One event object at p: its columns appended; past it, or NULL (outside the fast subset). */
static cp scan_event(Scan *sc, cp base, cp p, cp e) {
    Val f[NFIELDS];
    memset(f, 0, sizeof f);
    int64_t event = sc->n;
    size_t entries_at = sc->entries.len;
    if (p >= e || *p != '{') return NULL;
    p = ws(p + 1, e);
    if (p < e && *p == '}') {
        p++;
    } else {
        for (;;) {
            int esc = 0;
            if (p >= e || *p != '"') return NULL;
            cp ks = p + 1;
            if (!(p = scan_string(p, e, &esc)) || esc) return NULL;
            size_t kn = (size_t)(p - 1 - ks);
            p = ws(p, e);
            if (p >= e || *p != ':') return NULL;
            p = ws(p + 1, e);
            Val v = {p, NULL, 0, 0};
            if (p < e && *p == '"') p = scan_string(p, e, &v.esc);
            else if (p < e && (*p == '-' || is_digit(*p))) p = scan_number(p, e, &v.is_int);
            else p = skip_value(p, e, 1);
            if (!p) return NULL;
            v.e = p;
            int which = field_of(ks, kn);
            if (which >= 0) {
                if (f[which].s) return NULL;  /* a duplicate key */
                f[which] = v;
            } else {
                int k = key_index(sc, ks, kn);
                if (k < 0) return NULL;
                for (size_t at = entries_at; at < sc->entries.len; at += 32)
                    if (((int64_t *)(sc->entries.p + at))[1] == k) return NULL;  /* a duplicate key */
                if (!put_i64(&sc->entries, event) || !put_i64(&sc->entries, k) ||
                    !put_i64(&sc->entries, v.s - base) || !put_i64(&sc->entries, v.e - base))
                    return NULL;
            }
            p = ws(p, e);
            if (p >= e) return NULL;
            if (*p == ',') { p = ws(p + 1, e); continue; }
            if (*p == '}') { p++; break; }
            return NULL;
        }
    }
    /* ph: a string (a missing one is an error the Python decoder words) */
    if (!f[F_PH].s || *f[F_PH].s != '"') return NULL;
    size_t ph_at = sc->ph.data.len;
    if (!text_value(&f[F_PH], &sc->ph)) return NULL;
    int metadata = sc->ph.data.len - ph_at == 1 && sc->ph.data.p[ph_at] == 'M';
    if (!text_value(&f[F_NAME], &sc->name) || !text_value(&f[F_CAT], &sc->cat)) return NULL;
    int64_t pid, tid, ts, dur;
    int has_ts, has_dur;
    int pid_str, tid_str;
    if (!id_int(&f[F_PID], &pid, &pid_str) || !id_int(&f[F_TID], &tid, &tid_str)) return NULL;
    if (pid_str && (!put_i64(&sc->strids, event) || !put_i64(&sc->strids, 0) ||
                    !put_i64(&sc->strids, f[F_PID].s - base) || !put_i64(&sc->strids, f[F_PID].e - base)))
        return NULL;
    if (tid_str && (!put_i64(&sc->strids, event) || !put_i64(&sc->strids, 1) ||
                    !put_i64(&sc->strids, f[F_TID].s - base) || !put_i64(&sc->strids, f[F_TID].e - base)))
        return NULL;
    if (!time_ns(&f[F_TS], &ts, &has_ts) || !time_ns(&f[F_DUR], &dur, &has_dur)) return NULL;
    if ((!has_ts && !metadata) || dur < 0) return NULL;
    if (!put_i64(&sc->pid, pid) || !put_i64(&sc->tid, tid) || !put_i64(&sc->ts, ts) ||
        !put_u8(&sc->has_ts, (unsigned char)has_ts) || !put_i64(&sc->dur, dur) || !put_bit(&sc->dur_valid, has_dur))
        return NULL;
    /* id: an integer as its decimal text, a string as it is */
    const Val *id = &f[F_ID];
    if (id->s && *id->s != '"' && *id->s != 'n') {
        if (!id->is_int || (*id->s != '-' && !is_digit(*id->s))) return NULL;
        /* Up to 19 digits (18 when negative): inside the ids the Python decoder takes, which
         * writes them as their decimal text, as here; -0 it writes "0". */
        if (id->e - id->s > 19 || (id->e - id->s == 2 && id->s[0] == '-' && id->s[1] == '0')) return NULL;
        if (!put(&sc->id.data, id->s, (size_t)(id->e - id->s)) || !str_end(&sc->id, 1)) return NULL;
    } else if (!text_value(id, &sc->id)) {
        return NULL;
    }
    /* args: an object verbatim; null where absent or null */
    const Val *a = &f[F_ARGS];
    if (a->s && *a->s == '{') {
        if (!put(&sc->args.data, a->s, (size_t)(a->e - a->s)) || !str_end(&sc->args, 1)) return NULL;
    } else if (!a->s || *a->s == 'n') {
        if (!str_end(&sc->args, 0)) return NULL;
    } else {
        return NULL;
    }
    sc->n++;
    return p;
}

static void scan_free(Scan *sc) {
    StrCol *cols[] = {&sc->ph, &sc->name, &sc->cat, &sc->id, &sc->args};
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++) {
        free(cols[i]->valid.bits.p);
        free(cols[i]->off.p);
        free(cols[i]->data.p);
    }
    Buf *bufs[] = {&sc->pid, &sc->tid, &sc->ts, &sc->has_ts, &sc->dur, &sc->entries, &sc->strids, &sc->dur_valid.bits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]->p);
}

/* The whole run of events in [p, e); 1 when every byte of it is in the fast subset. */
static int scan_run(Scan *sc, cp base, cp p, cp e) {
    StrCol *cols[] = {&sc->ph, &sc->name, &sc->cat, &sc->id, &sc->args};
    for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
        if (!str_init(cols[i])) return 0;
    key_index(sc, (cp) "bp", 2);
    key_index(sc, (cp) "s", 1);
    p = ws(p, e);
    if (p == e) return 1;
    for (;;) {
        if (!(p = scan_event(sc, base, p, e))) return 0;
        p = ws(p, e);
        if (p == e) return 1;
        if (*p != ',') return 0;
        p = ws(p + 1, e);
    }
}

static PyObject *bytes_of(const Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &lo, &hi)) return NULL;
    if (lo < 0 || hi > view.len || lo > hi) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: span outside the buffer");
        return NULL;
    }
    Scan *sc = calloc(1, sizeof(Scan));
    if (!sc) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    cp base = (cp)view.buf;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scan_run(sc, base, base + lo, base + hi);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (!ok) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyObject *keys = PyList_New(sc->nkeys);
        for (int i = 0; keys && i < sc->nkeys; i++) {
            PyObject *k = PyBytes_FromStringAndSize((const char *)sc->keys[i].s, (Py_ssize_t)sc->keys[i].n);
            if (!k) { Py_CLEAR(keys); break; }
            PyList_SET_ITEM(keys, i, k);
        }
        if (keys)
            out = Py_BuildValue(
                "(nNNNnNNNnNNNNNNNNnNnNNNnNNNNN)", (Py_ssize_t)sc->n,
                bytes_of(&sc->ph.off), bytes_of(&sc->ph.data),
                bytes_of(&sc->name.valid.bits), (Py_ssize_t)sc->name.valid.nulls, bytes_of(&sc->name.off), bytes_of(&sc->name.data),
                bytes_of(&sc->cat.valid.bits), (Py_ssize_t)sc->cat.valid.nulls, bytes_of(&sc->cat.off), bytes_of(&sc->cat.data),
                bytes_of(&sc->pid), bytes_of(&sc->tid), bytes_of(&sc->ts), bytes_of(&sc->has_ts), bytes_of(&sc->dur),
                bytes_of(&sc->dur_valid.bits), (Py_ssize_t)sc->dur_valid.nulls,
                bytes_of(&sc->id.valid.bits), (Py_ssize_t)sc->id.valid.nulls, bytes_of(&sc->id.off), bytes_of(&sc->id.data),
                bytes_of(&sc->args.valid.bits), (Py_ssize_t)sc->args.valid.nulls, bytes_of(&sc->args.off), bytes_of(&sc->args.data),
                keys, bytes_of(&sc->entries), bytes_of(&sc->strids));
    }
    scan_free(sc);
    free(sc);
    PyBuffer_Release(&view);
    return out;
}

/* ------------------------------------------------------------------ the extra column */

typedef struct {
    int64_t key;   /* index in names */
    int64_t s, e;  /* the value's text */
} Entry;

static int by_key(const void *a, const void *b) {
    int64_t x = ((const Entry *)a)->key, y = ((const Entry *)b)->key;
    return (x > y) - (x < y);
}

static PyObject *extras(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t n;
    PyObject *parts, *names;
    if (!PyArg_ParseTuple(args, "y*nO!O!", &view, &n, &PyList_Type, &parts, &PyList_Type, &names)) return NULL;
    PyObject *out = NULL;
    StrCol col;
    memset(&col, 0, sizeof col);
    Entry *row = NULL;
    size_t row_cap = 0;
    int64_t done = 0;  /* events written so far */
    if (!str_init(&col)) goto nomem;
    for (Py_ssize_t pi = 0; pi < PyList_GET_SIZE(parts); pi++) {
        Py_ssize_t first;
        Py_buffer ent, map;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(parts, pi), "ny*y*", &first, &ent, &map)) goto fail;
        const int64_t *q = (const int64_t *)ent.buf;
        const int64_t *km = (const int64_t *)map.buf;
        Py_ssize_t nk = map.len / 8, ne = ent.len / 32;
        int bad = 0;
        for (Py_ssize_t i = 0; i < ne && !bad;) {
            int64_t ev = first + q[4 * i];
            size_t cnt = 0;
            while (done < ev && !bad) {  /* events without other keys */
                if (!str_end(&col, 0)) bad = 2;
                done++;
            }
            for (Py_ssize_t j = i; !bad && j < ne && first + q[4 * j] == ev; j++) {
                if (cnt == row_cap) {
                    row_cap = row_cap ? 2 * row_cap : 16;
                    Entry *r = realloc(row, row_cap * sizeof(Entry));
                    if (!r) { bad = 2; break; }
                    row = r;
                }
                int64_t k = q[4 * j + 1];
                if (k < 0 || k >= nk || km[k] < 0 || km[k] >= PyList_GET_SIZE(names)) { bad = 1; break; }
                row[cnt].key = km[k];
                row[cnt].s = q[4 * j + 2];
                row[cnt].e = q[4 * j + 3];
                cnt++;
            }
            if (bad) break;
            qsort(row, cnt, sizeof(Entry), by_key);
            if (!put_u8(&col.data, '{')) { bad = 2; break; }
            for (size_t j = 0; j < cnt && !bad; j++) {
                PyObject *name = PyList_GET_ITEM(names, row[j].key);
                if (!PyBytes_Check(name) || row[j].s < 0 || row[j].e > view.len || row[j].s > row[j].e) { bad = 1; break; }
                if ((j && !put_u8(&col.data, ',')) || !put_u8(&col.data, '"') ||
                    !put(&col.data, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name)) ||
                    !put(&col.data, "\":", 2) ||
                    !put(&col.data, (const char *)view.buf + row[j].s, (size_t)(row[j].e - row[j].s)))
                    bad = 2;
            }
            if (!bad && (!put_u8(&col.data, '}') || !str_end(&col, 1))) bad = 2;
            done++;
            i += (Py_ssize_t)cnt;
        }
        PyBuffer_Release(&ent);
        PyBuffer_Release(&map);
        if (bad == 1) { PyErr_SetString(PyExc_ValueError, "extras: an entry outside its part"); goto fail; }
        if (bad == 2) goto nomem;
    }
    while (done < n) {
        if (!str_end(&col, 0)) goto nomem;
        done++;
    }
    out = Py_BuildValue("(NnNN)", bytes_of(&col.valid.bits), (Py_ssize_t)col.valid.nulls, bytes_of(&col.off),
                        bytes_of(&col.data));
    goto fail;
nomem:
    if (col.data.len > INT32_MAX) {  /* beyond a string array: the Python decoder decides */
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyErr_NoMemory();
    }
fail:
    free(row);
    free(col.valid.bits.p);
    free(col.off.p);
    free(col.data.p);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(buffer, lo, hi): the events in buffer[lo:hi] as column buffers, or None"},
    {"extras", extras, METH_VARARGS, "extras(buffer, n, parts, names): the extra column's buffers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Native Chrome trace event scanner.", -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
