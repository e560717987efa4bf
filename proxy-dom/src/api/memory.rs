//! Buffers, sub-buffers, images, samplers and image formats. Host data
//! always arrives as the payload: a buffer's initial contents, an image's
//! pixels tightly packed (rows of width × pixel size, slices of rows ×
//! height); the proxy creates with `CL_MEM_COPY_HOST_PTR` from it, so no
//! client memory is ever used by the vendor after a call returns.

use std::ffi::c_void;

use crane_wire::{Answer, Id, ImageDesc, ImageFormat};
use opencl_sys::*;

use super::{check, made, or_null, terminated};
use crate::session::objects::{Detail, Kind};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

/// `cl_khr_gl_depth_images` values, absent from opencl-sys.
const CL_DEPTH_STENCIL: cl_channel_order = 0x10BE;
const CL_UNORM_INT24: cl_channel_type = 0x10DF;

/// Flags the client may not pass: host memory never crosses the wire as a
/// pointer.
const HOST_PTR_FLAGS: cl_mem_flags = CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR;

/// Bytes per pixel of an image format, if the proxy knows it.
#[allow(non_upper_case_globals)] // OpenCL's names: CL_sRGB, CL_Rx, ...
pub(crate) fn pixel_size(f: ImageFormat) -> Option<u64> {
    let packed = match (f.order, f.data_type) {
        (_, CL_UNORM_SHORT_565 | CL_UNORM_SHORT_555) => Some(2),
        (_, CL_UNORM_INT_101010 | CL_UNORM_INT_101010_2) => Some(4),
        (CL_DEPTH_STENCIL, CL_UNORM_INT24) => Some(4),
        (CL_DEPTH_STENCIL, CL_FLOAT) => Some(8),
        _ => None,
    };
    if packed.is_some() {
        return packed;
    }
    let channels = match f.order {
        CL_R | CL_A | CL_INTENSITY | CL_LUMINANCE | CL_DEPTH => 1,
        CL_RG | CL_RA | CL_Rx => 2,
        CL_RGB | CL_RGx | CL_sRGB => 3,
        CL_RGBA | CL_BGRA | CL_ARGB | CL_ABGR | CL_RGBx | CL_sRGBA | CL_sBGRA | CL_sRGBx => 4,
        _ => return None,
    };
    let size = match f.data_type {
        CL_SNORM_INT8 | CL_UNORM_INT8 | CL_SIGNED_INT8 | CL_UNSIGNED_INT8 => 1,
        CL_SNORM_INT16 | CL_UNORM_INT16 | CL_SIGNED_INT16 | CL_UNSIGNED_INT16 | CL_HALF_FLOAT => 2,
        CL_SIGNED_INT32 | CL_UNSIGNED_INT32 | CL_FLOAT | CL_UNORM_INT24 => 4,
        _ => return None,
    };
    Some(channels * size)
}

/// The tightly packed size of a whole image, if its type is known and the
/// size does not overflow.
pub(crate) fn packed_image_size(d: &ImageDesc, pixel: u64) -> Option<u64> {
    let (rows, slices) = match d.image_type {
        CL_MEM_OBJECT_IMAGE1D | CL_MEM_OBJECT_IMAGE1D_BUFFER => (1, 1),
        CL_MEM_OBJECT_IMAGE1D_ARRAY => (1, d.array_size),
        CL_MEM_OBJECT_IMAGE2D => (d.height, 1),
        CL_MEM_OBJECT_IMAGE2D_ARRAY => (d.height, d.array_size),
        CL_MEM_OBJECT_IMAGE3D => (d.height, d.depth),
        _ => return None,
    };
    d.width
        .checked_mul(rows)?
        .checked_mul(slices)?
        .checked_mul(pixel)
}

impl Session {
    /// The buffer `id` and its size; an image is CL_INVALID_MEM_OBJECT.
    pub(crate) fn buffer(&self, id: Id) -> CallResult<(VPtr, u64)> {
        let o = self.objects.get(id, Kind::Mem)?;
        let h = o.handle.map_err(CallError::Cl)?;
        match o.detail {
            Detail::Mem {
                extent,
                image: None,
                ..
            } => Ok((h, extent)),
            _ => Err(CallError::Cl(CL_INVALID_MEM_OBJECT)),
        }
    }

    /// The image `id`, its packed size and its pixel size; a buffer is
    /// CL_INVALID_MEM_OBJECT.
    pub(crate) fn image(&self, id: Id) -> CallResult<(VPtr, u64, u64)> {
        let o = self.objects.get(id, Kind::Mem)?;
        let h = o.handle.map_err(CallError::Cl)?;
        match o.detail {
            Detail::Mem {
                extent,
                image: Some(pixel),
                ..
            } => Ok((h, extent, pixel)),
            _ => Err(CallError::Cl(CL_INVALID_MEM_OBJECT)),
        }
    }

    pub(crate) fn create_buffer(
        &mut self,
        id: Id,
        context: Id,
        flags: u64,
        size: u64,
        props: &[u64],
        init: Option<Vec<u8>>,
    ) -> CallResult {
        if let Some(data) = &init
            && data.len() as u64 != size
        {
            return Err(CallError::Violation(format!(
                "the payload holds {} bytes, not the buffer's {size}",
                data.len()
            )));
        }
        let created = self.create(id, Kind::Mem, |s| {
            s.objects.admit(size)?;
            let ctx = s.objects.handle(context, Kind::Context)?;
            let mut flags = flags & !HOST_PTR_FLAGS;
            let host = match &init {
                Some(data) => {
                    flags |= CL_MEM_COPY_HOST_PTR;
                    data.as_ptr() as *mut c_void
                }
                None => std::ptr::null_mut(),
            };
            let mut err = CL_SUCCESS;
            let h = if props.is_empty() {
                let f = vfn!(ctx.get(), clCreateBuffer)?;
                // SAFETY: a live context; `host` is NULL or `size` bytes the
                // vendor copies before returning (COPY_HOST_PTR).
                unsafe { f(ctx.get().cast(), flags, size as usize, host, &mut err) }
            } else {
                let props: Vec<cl_mem_properties> = terminated(props, |v| v, 0);
                let f = vfn!(ctx.get(), clCreateBufferWithProperties)?;
                // SAFETY: as above, with a terminated property list.
                unsafe {
                    f(
                        ctx.get().cast(),
                        props.as_ptr(),
                        flags,
                        size as usize,
                        host,
                        &mut err,
                    )
                }
            };
            Ok((
                made(h, err)?,
                Detail::Mem {
                    extent: size,
                    charged: size,
                    image: None,
                    sub: false,
                },
            ))
        });
        if let Some(data) = init {
            // Copied by the vendor: the buffer can serve the next transfer.
            self.completion.inflight.buffers.give(data);
        }
        created
    }

    pub(crate) fn create_sub_buffer(
        &mut self,
        id: Id,
        parent: Id,
        flags: u64,
        origin: u64,
        size: u64,
    ) -> CallResult {
        self.create(id, Kind::Mem, |s| {
            let (p, _) = s.buffer(parent)?;
            let f = vfn!(p.get(), clCreateSubBuffer)?;
            let region = cl_buffer_region {
                origin: origin as usize,
                size: size as usize,
            };
            let mut err = CL_SUCCESS;
            // SAFETY: a live buffer; `region` is the REGION create info.
            let h = unsafe {
                f(
                    p.get().cast(),
                    flags & !HOST_PTR_FLAGS,
                    CL_BUFFER_CREATE_TYPE_REGION,
                    (&raw const region).cast(),
                    &mut err,
                )
            };
            let h = made(h, err)?;
            s.quirks.made_sub_buffer(p, h);
            Ok((
                h,
                Detail::Mem {
                    extent: size,
                    charged: 0,
                    image: None,
                    sub: true,
                },
            ))
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_image(
        &mut self,
        id: Id,
        context: Id,
        flags: u64,
        format: ImageFormat,
        desc: ImageDesc,
        props: &[u64],
        init: Option<Vec<u8>>,
    ) -> CallResult {
        let pixel = pixel_size(format);
        let packed = pixel.and_then(|p| packed_image_size(&desc, p));
        if let (Some(data), Some(packed)) = (&init, packed)
            && data.len() as u64 != packed
        {
            return Err(CallError::Violation(format!(
                "the payload holds {} bytes, not the image's {packed} (tightly packed)",
                data.len()
            )));
        }
        self.create(id, Kind::Mem, |s| {
            let pixel = pixel.ok_or(CallError::Cl(CL_IMAGE_FORMAT_NOT_SUPPORTED))?;
            let packed = packed.ok_or(CallError::Cl(CL_INVALID_IMAGE_DESCRIPTOR))?;
            // An image made from a buffer aliases the buffer's memory.
            let backed = desc.buffer != 0;
            let charged = if backed { 0 } else { packed };
            s.objects.admit(charged)?;
            let ctx = s.objects.handle(context, Kind::Context)?;
            let mem_object = s.objects.handle_or_null(desc.buffer, Kind::Mem)?;
            let mut flags = flags & !HOST_PTR_FLAGS;
            let (host, row_pitch, slice_pitch) = match &init {
                Some(data) => {
                    flags |= CL_MEM_COPY_HOST_PTR;
                    (data.as_ptr() as *mut c_void, 0, 0)
                }
                None => (std::ptr::null_mut(), desc.row_pitch, desc.slice_pitch),
            };
            let cdesc = cl_image_desc {
                image_type: desc.image_type,
                image_width: desc.width as usize,
                image_height: desc.height as usize,
                image_depth: desc.depth as usize,
                image_array_size: desc.array_size as usize,
                image_row_pitch: row_pitch as usize,
                image_slice_pitch: slice_pitch as usize,
                num_mip_levels: desc.num_mip_levels,
                num_samples: desc.num_samples,
                buffer: mem_object.get().cast(),
            };
            let cformat = cl_image_format {
                image_channel_order: format.order,
                image_channel_data_type: format.data_type,
            };
            let mut err = CL_SUCCESS;
            let h = if props.is_empty() {
                let f = vfn!(ctx.get(), clCreateImage)?;
                // SAFETY: a live context; `host` is NULL or the packed
                // image (its size checked above), copied before returning.
                unsafe { f(ctx.get().cast(), flags, &cformat, &cdesc, host, &mut err) }
            } else {
                let props: Vec<cl_mem_properties> = terminated(props, |v| v, 0);
                let f = vfn!(ctx.get(), clCreateImageWithProperties)?;
                // SAFETY: as above, with a terminated property list.
                unsafe {
                    f(
                        ctx.get().cast(),
                        props.as_ptr(),
                        flags,
                        &cformat,
                        &cdesc,
                        host,
                        &mut err,
                    )
                }
            };
            Ok((
                made(h, err)?,
                Detail::Mem {
                    extent: packed,
                    charged,
                    image: Some(pixel),
                    sub: false,
                },
            ))
        })
    }

    pub(crate) fn create_sampler(&mut self, id: Id, context: Id, props: &[u64]) -> CallResult {
        self.create(id, Kind::Sampler, |s| {
            let ctx = s.objects.handle(context, Kind::Context)?;
            let mut err = CL_SUCCESS;
            let h = match vfn!(ctx.get(), clCreateSamplerWithProperties) {
                Ok(f) => {
                    let props: Vec<cl_sampler_properties> = terminated(props, |v| v, 0);
                    // SAFETY: a live context; a terminated list (or NULL).
                    unsafe { f(ctx.get().cast(), or_null(&props), &mut err) }
                }
                Err(_) => {
                    let (mut norm, mut addr, mut filter) =
                        (CL_TRUE, CL_ADDRESS_CLAMP, CL_FILTER_NEAREST);
                    for pair in props.chunks(2) {
                        match *pair {
                            [k, v] if k == u64::from(CL_SAMPLER_NORMALIZED_COORDS) => {
                                norm = v as cl_bool
                            }
                            [k, v] if k == u64::from(CL_SAMPLER_ADDRESSING_MODE) => {
                                addr = v as cl_uint
                            }
                            [k, v] if k == u64::from(CL_SAMPLER_FILTER_MODE) => {
                                filter = v as cl_uint
                            }
                            _ => return Err(CallError::Cl(CL_INVALID_VALUE)),
                        }
                    }
                    let f = vfn!(ctx.get(), clCreateSampler)?;
                    // SAFETY: a live context.
                    unsafe { f(ctx.get().cast(), norm, addr, filter, &mut err) }
                }
            };
            Ok((made(h, err)?, Detail::Plain))
        })
    }

    pub(crate) fn get_supported_image_formats(
        &mut self,
        seq: u64,
        context: Id,
        flags: u64,
        image_type: u32,
    ) -> CallResult {
        let ctx = self.objects.handle(context, Kind::Context)?;
        let f = vfn!(ctx.get(), clGetSupportedImageFormats)?;
        let flags = flags & !HOST_PTR_FLAGS;
        let mut n: cl_uint = 0;
        // SAFETY: a count query on a live context.
        check(unsafe {
            f(
                ctx.get().cast(),
                flags,
                image_type,
                0,
                std::ptr::null_mut(),
                &mut n,
            )
        })?;
        let mut formats = vec![
            cl_image_format {
                image_channel_order: 0,
                image_channel_data_type: 0,
            };
            n as usize
        ];
        if n > 0 {
            // SAFETY: `formats` holds n entries.
            check(unsafe {
                f(
                    ctx.get().cast(),
                    flags,
                    image_type,
                    n,
                    formats.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })?;
        }
        let formats = formats
            .into_iter()
            .map(|f| ImageFormat {
                order: f.image_channel_order,
                data_type: f.image_channel_data_type,
            })
            .collect();
        self.reply(
            seq,
            &Answer::Formats {
                status: CL_SUCCESS,
                formats,
            },
            &[],
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(image_type: u32, w: u64, h: u64, d: u64, a: u64) -> ImageDesc {
        ImageDesc {
            image_type,
            width: w,
            height: h,
            depth: d,
            array_size: a,
            row_pitch: 0,
            slice_pitch: 0,
            num_mip_levels: 0,
            num_samples: 0,
            buffer: 0,
        }
    }

    #[test]
    fn pixel_sizes() {
        let f = |order, data_type| pixel_size(ImageFormat { order, data_type });
        assert_eq!(f(CL_RGBA, CL_UNORM_INT8), Some(4));
        assert_eq!(f(CL_RGBA, CL_FLOAT), Some(16));
        assert_eq!(f(CL_R, CL_HALF_FLOAT), Some(2));
        assert_eq!(f(CL_RGB, CL_UNORM_SHORT_565), Some(2));
        assert_eq!(f(CL_RG, CL_SIGNED_INT32), Some(8));
        assert_eq!(f(CL_DEPTH_STENCIL, CL_FLOAT), Some(8));
        assert_eq!(f(0x4000, CL_FLOAT), None);
        assert_eq!(f(CL_RGBA, 0x4000), None);
    }

    #[test]
    fn packed_sizes_per_image_type() {
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE1D, 7, 9, 9, 9), 4),
            Some(28)
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE1D_ARRAY, 7, 9, 9, 3), 4),
            Some(84)
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE2D, 7, 5, 9, 9), 2),
            Some(70)
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE2D_ARRAY, 7, 5, 9, 3), 1),
            Some(105)
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE3D, 7, 5, 2, 9), 1),
            Some(70)
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_IMAGE3D, u64::MAX, 5, 2, 9), 1),
            None
        );
        assert_eq!(
            packed_image_size(&desc(CL_MEM_OBJECT_BUFFER, 7, 5, 2, 9), 1),
            None
        );
    }
}
