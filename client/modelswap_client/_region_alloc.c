/*
 * The allocation shim of modelswap_client.allocation: arenas that hand out pieces of an
 * attached region's address range, and the entry points torch's CUDAPluggableAllocator
 * calls, so a torch.cuda.memory.MemPool over them places tensors inside the region.
 *
 * The shim never reads or writes the memory it manages: an arena is bookkeeping over a
 * range [base, base + size) of addresses (the region is mapped and unmapped by the client
 * library; its addresses stay put across swaps). That is why it needs no CUDA headers,
 * and why its logic can be tested on a CPU against a made-up base address.
 *
 * Each arena keeps one list of blocks covering its whole range in address order, each
 * block free or in use. Allocation is best fit (the smallest free block that holds the
 * request; the lowest address among equals), split off the front of that block; freeing
 * merges the block with free neighbours, so free blocks are never adjacent. Sizes and
 * offsets are multiples of MS_ALIGN_BYTES. A request that does not fit returns NULL (torch
 * then frees its cached blocks, retries, and raises its out-of-memory error). Freeing an
 * address that is not the start of a block in use (never given out, freed twice, or a
 * pointer into the middle of a block) changes nothing and is counted. Lookups walk the
 * list: torch's caching allocator asks for segments of 2 MiB and more, so an arena holds
 * few blocks (at most 512 per GiB).
 *
 * torch's pluggable allocator takes plain function pointers (no user data), so the shim
 * has a fixed table of slots, each with its own pair of entry points
 * (modelswap_alloc_<n>, modelswap_free_<n>). An arena bound to a slot stays bound for the
 * life of the process: a MemPool may free into it for as long as torch holds that pool,
 * so neither the slot nor the arena may be reused or destroyed under it.
 *
 * Every arena has its own mutex; the slot table is written once per slot (compare and
 * swap) and read with acquire loads.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#define MS_ALIGN_BYTES 512u
#define MS_SLOT_COUNT 64

typedef struct ms_block {
    uintptr_t address;
    size_t size;
    int in_use;
    struct ms_block *prev;
    struct ms_block *next;
} ms_block;

typedef struct ms_arena {
    pthread_mutex_t lock;
    uintptr_t base;
    size_t size;
    int device;
    ms_block *head;
    size_t in_use_bytes;
    size_t peak_bytes;
    uint64_t live_allocations;
    uint64_t allocations_total;
    uint64_t failed_allocations;
    uint64_t refused_frees;
    uint64_t wrong_device_allocations;
} ms_arena;

/* What modelswap_arena_stats fills in; the Python side mirrors this layout. */
typedef struct ms_stats {
    uint64_t size_bytes;
    uint64_t in_use_bytes;
    uint64_t peak_bytes;
    uint64_t free_bytes;
    uint64_t largest_free_bytes;
    uint64_t free_blocks;
    uint64_t live_allocations;
    uint64_t allocations_total;
    uint64_t failed_allocations;
    uint64_t refused_frees;
    uint64_t wrong_device_allocations;
} ms_stats;

int modelswap_shim_version(void) { return 1; }
size_t modelswap_alignment_bytes(void) { return MS_ALIGN_BYTES; }
int modelswap_slot_count(void) { return MS_SLOT_COUNT; }

/* An arena over [base, base + size), trimmed inwards to MS_ALIGN_BYTES boundaries. NULL
 * when nothing aligned fits in the range or the host is out of memory. */
ms_arena *modelswap_arena_create(uintptr_t base, size_t size, int device) {
    uintptr_t start = (base + (MS_ALIGN_BYTES - 1)) & ~(uintptr_t)(MS_ALIGN_BYTES - 1);
    if (start < base || size < start - base) {
        return NULL;
    }
    size_t usable = (size - (start - base)) & ~(size_t)(MS_ALIGN_BYTES - 1);
    if (usable == 0 || start + usable < start) {
        return NULL;
    }
    ms_arena *a = calloc(1, sizeof *a);
    ms_block *all = calloc(1, sizeof *all);
    if (a == NULL || all == NULL || pthread_mutex_init(&a->lock, NULL) != 0) {
        free(a);
        free(all);
        return NULL;
    }
    all->address = start;
    all->size = usable;
    a->base = start;
    a->size = usable;
    a->device = device;
    a->head = all;
    return a;
}

/* Frees the bookkeeping. Refused (-1) while anything is allocated; never call it on an
 * arena bound to a slot. */
int modelswap_arena_destroy(ms_arena *a) {
    if (a == NULL) {
        return 0;
    }
    pthread_mutex_lock(&a->lock);
    int busy = a->live_allocations != 0;
    pthread_mutex_unlock(&a->lock);
    if (busy) {
        return -1;
    }
    ms_block *b = a->head;
    while (b != NULL) {
        ms_block *next = b->next;
        free(b);
        b = next;
    }
    pthread_mutex_destroy(&a->lock);
    free(a);
    return 0;
}

static void *arena_alloc_locked(ms_arena *a, size_t size) {
    if (size > SIZE_MAX - (MS_ALIGN_BYTES - 1)) {
        return NULL;
    }
    size_t need = (size + (MS_ALIGN_BYTES - 1)) & ~(size_t)(MS_ALIGN_BYTES - 1);
    ms_block *best = NULL;
    for (ms_block *b = a->head; b != NULL; b = b->next) {
        if (!b->in_use && b->size >= need && (best == NULL || b->size < best->size)) {
            best = b;
            if (b->size == need) {
                break;
            }
        }
    }
    if (best == NULL) {
        return NULL;
    }
    if (best->size > need) {
        ms_block *rest = calloc(1, sizeof *rest);
        if (rest == NULL) {
            return NULL;
        }
        rest->address = best->address + need;
        rest->size = best->size - need;
        rest->prev = best;
        rest->next = best->next;
        if (best->next != NULL) {
            best->next->prev = rest;
        }
        best->next = rest;
        best->size = need;
    }
    best->in_use = 1;
    a->in_use_bytes += need;
    if (a->in_use_bytes > a->peak_bytes) {
        a->peak_bytes = a->in_use_bytes;
    }
    a->live_allocations++;
    a->allocations_total++;
    return (void *)best->address;
}

/* A piece of at least `size` bytes (rounded up to MS_ALIGN_BYTES), or NULL when the arena
 * has no free block that large. A request of 0 bytes gets NULL and is not a failure. */
void *modelswap_arena_alloc(ms_arena *a, size_t size) {
    if (a == NULL || size == 0) {
        return NULL;
    }
    pthread_mutex_lock(&a->lock);
    void *p = arena_alloc_locked(a, size);
    if (p == NULL) {
        a->failed_allocations++;
    }
    pthread_mutex_unlock(&a->lock);
    return p;
}

static void unlink_block(ms_arena *a, ms_block *b) {
    if (b->prev != NULL) {
        b->prev->next = b->next;
    } else {
        a->head = b->next;
    }
    if (b->next != NULL) {
        b->next->prev = b->prev;
    }
    free(b);
}

/* Gives back a piece modelswap_arena_alloc returned: 0. NULL is a no-op (0), as for
 * free(3). Any other address (never given out, already freed, inside a piece): -1,
 * nothing changes, and refused_frees counts it. `size` is what the caller believes it
 * asked for; the arena's own record decides. */
int modelswap_arena_free(ms_arena *a, void *ptr, size_t size) {
    (void)size;
    if (a == NULL) {
        return -1;
    }
    if (ptr == NULL) {
        return 0;
    }
    uintptr_t address = (uintptr_t)ptr;
    pthread_mutex_lock(&a->lock);
    ms_block *b = NULL;
    if (address >= a->base && address - a->base < a->size) {
        for (ms_block *it = a->head; it != NULL && it->address <= address; it = it->next) {
            if (it->address == address) {
                b = it;
                break;
            }
        }
    }
    if (b == NULL || !b->in_use) {
        a->refused_frees++;
        pthread_mutex_unlock(&a->lock);
        return -1;
    }
    b->in_use = 0;
    a->in_use_bytes -= b->size;
    a->live_allocations--;
    if (b->next != NULL && !b->next->in_use) {
        b->size += b->next->size;
        unlink_block(a, b->next);
    }
    if (b->prev != NULL && !b->prev->in_use) {
        b->prev->size += b->size;
        unlink_block(a, b);
    }
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int modelswap_arena_stats(ms_arena *a, ms_stats *out) {
    if (a == NULL || out == NULL) {
        return -1;
    }
    pthread_mutex_lock(&a->lock);
    uint64_t free_bytes = 0;
    uint64_t largest = 0;
    uint64_t free_blocks = 0;
    for (ms_block *b = a->head; b != NULL; b = b->next) {
        if (!b->in_use) {
            free_bytes += b->size;
            free_blocks++;
            if (b->size > largest) {
                largest = b->size;
            }
        }
    }
    out->size_bytes = a->size;
    out->in_use_bytes = a->in_use_bytes;
    out->peak_bytes = a->peak_bytes;
    out->free_bytes = free_bytes;
    out->largest_free_bytes = largest;
    out->free_blocks = free_blocks;
    out->live_allocations = a->live_allocations;
    out->allocations_total = a->allocations_total;
    out->failed_allocations = a->failed_allocations;
    out->refused_frees = a->refused_frees;
    out->wrong_device_allocations = a->wrong_device_allocations;
    pthread_mutex_unlock(&a->lock);
    return 0;
}

/* The first and last address of the arena (after alignment). */
uintptr_t modelswap_arena_base(ms_arena *a) { return a == NULL ? 0 : a->base; }
size_t modelswap_arena_size(ms_arena *a) { return a == NULL ? 0 : a->size; }

/* ---- slots: the entry points torch calls ------------------------------------------- */

static ms_arena *slots[MS_SLOT_COUNT];

/* Binds `a` to slot `n` for good: 0, or -1 when the slot is taken or out of range. */
int modelswap_slot_bind(int n, ms_arena *a) {
    if (n < 0 || n >= MS_SLOT_COUNT || a == NULL) {
        return -1;
    }
    ms_arena *expected = NULL;
    int ok = __atomic_compare_exchange_n(&slots[n], &expected, a, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE);
    return ok ? 0 : -1;
}

ms_arena *modelswap_slot_arena(int n) {
    if (n < 0 || n >= MS_SLOT_COUNT) {
        return NULL;
    }
    return __atomic_load_n(&slots[n], __ATOMIC_ACQUIRE);
}

static void *slot_alloc(int n, ssize_t size, int device) {
    ms_arena *a = modelswap_slot_arena(n);
    if (a == NULL || size <= 0) {
        return NULL;
    }
    if (device != a->device) {
        /* memory of another GPU than the one torch asked for would be wrong, not short */
        pthread_mutex_lock(&a->lock);
        a->wrong_device_allocations++;
        a->failed_allocations++;
        pthread_mutex_unlock(&a->lock);
        return NULL;
    }
    return modelswap_arena_alloc(a, (size_t)size);
}

static void slot_free(int n, void *ptr, ssize_t size) {
    ms_arena *a = modelswap_slot_arena(n);
    if (a != NULL) {
        modelswap_arena_free(a, ptr, size < 0 ? 0 : (size_t)size);
    }
}

/* torch.cuda.memory.CUDAPluggableAllocator's signatures; cudaStream_t is a pointer that
 * the shim never uses (the region is one address range for every stream). */
#define MS_SLOT(n)                                                                   \
    void *modelswap_alloc_##n(ssize_t size, int device, void *stream) {              \
        (void)stream;                                                                \
        return slot_alloc(n, size, device);                                          \
    }                                                                                \
    void modelswap_free_##n(void *ptr, ssize_t size, int device, void *stream) {     \
        (void)device;                                                                \
        (void)stream;                                                                \
        slot_free(n, ptr, size);                                                     \
    }

MS_SLOT(0) MS_SLOT(1) MS_SLOT(2) MS_SLOT(3) MS_SLOT(4) MS_SLOT(5) MS_SLOT(6) MS_SLOT(7)
MS_SLOT(8) MS_SLOT(9) MS_SLOT(10) MS_SLOT(11) MS_SLOT(12) MS_SLOT(13) MS_SLOT(14) MS_SLOT(15)
MS_SLOT(16) MS_SLOT(17) MS_SLOT(18) MS_SLOT(19) MS_SLOT(20) MS_SLOT(21) MS_SLOT(22) MS_SLOT(23)
MS_SLOT(24) MS_SLOT(25) MS_SLOT(26) MS_SLOT(27) MS_SLOT(28) MS_SLOT(29) MS_SLOT(30) MS_SLOT(31)
MS_SLOT(32) MS_SLOT(33) MS_SLOT(34) MS_SLOT(35) MS_SLOT(36) MS_SLOT(37) MS_SLOT(38) MS_SLOT(39)
MS_SLOT(40) MS_SLOT(41) MS_SLOT(42) MS_SLOT(43) MS_SLOT(44) MS_SLOT(45) MS_SLOT(46) MS_SLOT(47)
MS_SLOT(48) MS_SLOT(49) MS_SLOT(50) MS_SLOT(51) MS_SLOT(52) MS_SLOT(53) MS_SLOT(54) MS_SLOT(55)
MS_SLOT(56) MS_SLOT(57) MS_SLOT(58) MS_SLOT(59) MS_SLOT(60) MS_SLOT(61) MS_SLOT(62) MS_SLOT(63)
